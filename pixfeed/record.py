"""One stored record as a single buffer: a fixed header, then the stored bytes.

This is the value layout of the LMDB format (``pixfeed.packers.lmdb``); any
language can parse it: a 40-byte little-endian header, struct format
``"<4sBBHqQIIQ"`` (magic b"PXFR", version, kind, reserved, label, checksum,
height, width, length), the stored bytes, then (version 2) the field table.
The byte-by-byte table is docs/formats.md#lmdb, documented once.

``parse`` checks every structural field and raises CorruptDataError naming
the record on any malformed buffer; it does not check the checksum (readers
do that, see ``pixfeed.datasets.base``).
"""
from __future__ import annotations

import struct
from typing import List, NamedTuple, Tuple

from .errors import CorruptDataError

HEADER = struct.Struct("<4sBBHqQIIQ")
FIELD_COUNT, FIELD_ENTRY = struct.Struct("<I"), struct.Struct("<IQ")
MAGIC = b"PXFR"
VERSION = 2
VERSIONS = (1, 2)
KINDS = ("raw", "jpeg", "png", "webp")


class Header(NamedTuple):
    kind: str       # "raw" | "jpeg" | "png" | "webp"
    label: int
    checksum: int
    height: int
    width: int
    length: int


def pack_header(kind: str, label: int, checksum: int, shape: Tuple[int, int], length: int) -> bytes:
    """The 40-byte header of a record whose ``length`` stored bytes follow it."""
    return HEADER.pack(MAGIC, VERSION, KINDS.index(kind), 0, label, checksum, shape[0], shape[1], length)


def pack_fields(fields: List[bytes], checksums: List[int]) -> bytes:
    """The field table that follows a version-2 record's stored bytes."""
    parts = [FIELD_COUNT.pack(len(fields))]
    for data, checksum in zip(fields, checksums):
        parts += [FIELD_ENTRY.pack(len(data), checksum), data]
    return b"".join(parts)


def parse_fields(table: memoryview, where: str) -> List[Tuple[memoryview, int]]:
    """(stored bytes, checksum) of each field in a record's field table (empty for version 1)."""
    if not len(table):
        return []
    out, pos = [], FIELD_COUNT.size
    count, = FIELD_COUNT.unpack_from(table)
    for _ in range(count):
        if pos + FIELD_ENTRY.size > len(table):
            _fail(where, "the field table ends inside a field's entry")
        n, checksum = FIELD_ENTRY.unpack_from(table, pos)
        pos += FIELD_ENTRY.size
        if pos + n > len(table):
            _fail(where, f"a field of {n} bytes runs past the end of the record")
        out.append((table[pos:pos + n], checksum))
        pos += n
    if pos != len(table):
        _fail(where, f"{len(table) - pos} bytes after the field table")
    return out


def parse(buf, where: str) -> Tuple[Header, memoryview]:
    """Split a record buffer into its checked header and a view of its stored bytes (version 2: the
    field table follows them, ``field_table``).

    ``where`` names the record (e.g. the LMDB key) in the CorruptDataError
    raised for a short buffer, a wrong magic or version, an unknown kind or a
    length that does not match the buffer or the image shape.
    """
    view = memoryview(buf).cast("B")
    if len(view) < HEADER.size:
        _fail(where, f"{len(view)} bytes, shorter than the {HEADER.size}-byte record header")
    magic, version, kind, reserved, label, checksum, h, w, length = HEADER.unpack_from(view)
    if magic != MAGIC:
        _fail(where, f"starts with {bytes(magic)!r}, not the record magic {MAGIC!r}")
    if version not in VERSIONS:
        _fail(where, f"record version {version} is not supported (this pixfeed reads versions 1 and 2)")
    if kind >= len(KINDS) or reserved:
        _fail(where, f"unknown record kind {kind} (reserved field {reserved})")
    if h < 1 or w < 1:
        _fail(where, f"image shape {h}x{w} is empty")
    rest = len(view) - HEADER.size
    if (length != rest if version == 1 else length + FIELD_COUNT.size > rest) \
            or (KINDS[kind] == "raw" and length != h * w * 3):
        _fail(where, f"header says {length} stored bytes of a {h}x{w} {KINDS[kind]} image, "
                     f"but {rest} bytes follow")
    return Header(KINDS[kind], label, checksum, h, w, length), view[HEADER.size:HEADER.size + length]


def field_table(buf, header: Header, where: str) -> List[Tuple[memoryview, int]]:
    """(stored bytes, checksum) of each field of a record that ``parse`` checked (none in version 1)."""
    return parse_fields(memoryview(buf).cast("B")[HEADER.size + header.length:], where)


def _fail(where: str, reason: str) -> None:
    raise CorruptDataError(f"{where}: malformed record: {reason}")
