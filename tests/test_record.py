"""The shared record header and field table: round trips, and no malformed buffer gets past ``parse``."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pixfeed.errors import CorruptDataError
from pixfeed.record import HEADER, KINDS, MAGIC, Header, field_table, pack_fields, pack_header, parse

WHERE = "data.mdb key 0000000042"
u32 = st.integers(1, 2**32 - 1)


def expected(buf: bytes):
    """What a well-formed ``buf`` must parse to, by the documented layout; None if malformed."""
    if len(buf) < 40:
        return None
    magic, version, kind, reserved, label, checksum, h, w, n = struct.unpack_from("<4sBBHqQIIQ", buf)
    if magic != b"PXFR" or version not in (1, 2) or kind > 2 or reserved or h == 0 or w == 0:
        return None
    if (n != len(buf) - 40 if version == 1 else n + 4 > len(buf) - 40) or (kind == 0 and n != h * w * 3):
        return None
    return Header(("raw", "jpeg", "png")[kind], label, checksum, h, w, n), buf[40:40 + n]


def check_any(buf: bytes) -> None:
    """``parse`` either returns exactly the documented value or raises CorruptDataError naming the key."""
    want = expected(buf)
    try:
        header, data = parse(buf, WHERE)
    except CorruptDataError as e:
        assert want is None and str(e).startswith(WHERE + ": malformed record: ")
        return
    assert want is not None and (header, bytes(data)) == want


@given(st.binary(max_size=120))
def test_random_bytes(buf):
    check_any(buf)


@given(st.sampled_from([b"", b"\x01", b"\x01\x00", b"\x01\x03", b"\x02\x01"]), st.binary(max_size=80))
def test_random_bytes_after_the_magic(head, rest):
    check_any(MAGIC + head + rest)


@given(st.integers(0, 2), st.integers(-2**63, 2**63 - 1), st.integers(0, 2**64 - 1), u32, u32,
       st.binary(max_size=64), st.integers(-1, 1))
def test_headers_with_random_fields(kind, label, checksum, h, w, data, skew):
    for version in (1, 2):
        check_any(HEADER.pack(MAGIC, version, kind, 0, label, checksum, h, w, max(0, len(data) + skew)) + data)


@given(st.sampled_from(KINDS), st.integers(-1, 10**6), st.integers(0, 2**64 - 1),
       st.integers(1, 6), st.integers(1, 6), st.data())
def test_round_trip(kind, label, checksum, h, w, draw):
    data = draw.draw(st.binary(min_size=h * w * 3, max_size=h * w * 3) if kind == "raw" else st.binary(max_size=50))
    fields = draw.draw(st.lists(st.binary(max_size=20), max_size=3))
    sums = list(range(len(fields)))
    buf = pack_header(kind, label, checksum, (h, w), len(data)) + data + pack_fields(fields, sums)
    header, view = parse(buf, WHERE)
    assert header == Header(kind, label, checksum, h, w, len(data)) and bytes(view) == data
    assert [(bytes(v), c) for v, c in field_table(buf, header, WHERE)] == list(zip(fields, sums))
    for cut in (0, 39, 40 + len(data) + 3):
        if cut < len(buf):
            with pytest.raises(CorruptDataError, match=WHERE):
                parse(buf[:cut], WHERE)


def test_each_malformation_is_named():
    good = pack_header("raw", 3, 7, (2, 2), 12) + bytes(12) + pack_fields([], [])
    v1 = good[:4] + b"\x01" + good[5:-4]
    cases = {b"PXFQ" + good[4:]: "not the record magic", good[:4] + b"\x03" + good[5:]: "record version 3",
             good[:5] + b"\x07" + good[6:]: "unknown record kind 7", good[:10]: "shorter than the 40-byte",
             v1 + b"\x00": "13 bytes follow", good[:-1]: "15 bytes follow",
             pack_header("raw", 3, 7, (2, 3), 12) + bytes(16): "2x3 raw image"}
    for buf, reason in cases.items():
        with pytest.raises(CorruptDataError, match=reason):
            parse(buf, WHERE)
    header, _ = parse(v1, WHERE)
    assert field_table(v1, header, WHERE) == []


def test_damaged_field_tables_are_named():
    table = pack_fields([b"abc", b"de"], [1, 2])
    buf = pack_header("jpeg", 0, 0, (1, 1), 2) + b"\xff\xd8"
    for bad, reason in ((table[:-1], "runs past the end"), (table + b"x", "bytes after the field table"),
                        (table[:6], "ends inside a field's entry")):
        header, _ = parse(buf + bad, WHERE)
        with pytest.raises(CorruptDataError, match=reason):
            field_table(buf + bad, header, WHERE)
