"""_tarwalk.members: the same (name, data offset, size) as tarfile for every tar flavour; plain ustar
shards walked without tarfile, anything else handed to it."""
from __future__ import annotations

import io
import tarfile

import pytest
import webdataset

from pixfeed.sources import _tarwalk


def by_tarfile(data: bytes) -> list:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return [(i.name, i.offset_data, i.size) for i in tar if i.isfile()]


def tar_bytes(fmt, names, dirs=()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for k, name in enumerate(names):
            blob = bytes(range(256)) * k + b"x" * (k % 7)
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return buf.getvalue()


SHORT = ["00000/000000012.jpg", "00000/000000012.txt", "a.cls", "b" * 100]
PREFIXED = ["p" * 120 + "/file.jpg"]             # ustar: a prefix field
LONG = ["n" * 150 + ".jpg", "caf\u00e9/\u732b.json"]  # PAX records / GNU long names


@pytest.mark.parametrize("fmt,names,plain", [
    (tarfile.USTAR_FORMAT, SHORT, True), (tarfile.USTAR_FORMAT, SHORT + PREFIXED, True),
    (tarfile.GNU_FORMAT, SHORT, True), (tarfile.PAX_FORMAT, SHORT, True),
    (tarfile.PAX_FORMAT, SHORT + LONG, True), (tarfile.GNU_FORMAT, SHORT + LONG, False)])
def test_members_equal_tarfiles(fmt, names, plain):
    data = tar_bytes(fmt, names, dirs=["00000/"])
    assert _tarwalk.members(io.BytesIO(data)) == by_tarfile(data)
    assert (_tarwalk._plain(io.BytesIO(data)) is not None) == plain


def test_webdataset_shardwriter_shards_are_walked_plainly(tmp_path):
    with webdataset.ShardWriter(str(tmp_path / "s-%06d.tar"), maxcount=100) as sink:
        for i in range(20):
            sink.write({"__key__": f"{i:06d}", "jpg": b"\xff\xd8" + bytes(i), "txt": f"caption {i}", "cls": i % 3})
    data = (tmp_path / "s-000000.tar").read_bytes()
    assert _tarwalk._plain(io.BytesIO(data)) == by_tarfile(data) and len(by_tarfile(data)) == 60


def test_damaged_headers_go_to_tarfile():
    data = bytearray(tar_bytes(tarfile.USTAR_FORMAT, SHORT))
    second = by_tarfile(bytes(data))[1][1]  # the second member's data
    data[second + 100] ^= 0xFF  # inside data, not a header: nothing changes
    assert _tarwalk.members(io.BytesIO(bytes(data))) == by_tarfile(bytes(data))
    data[second - 512 + 5] ^= 0x01  # the second header's name: its checksum no longer matches
    assert _tarwalk._plain(io.BytesIO(bytes(data))) is None
    with pytest.raises(tarfile.TarError):
        _tarwalk.members(io.BytesIO(b"not a tar file at all" * 40))


def test_the_header_checksum_check_is_the_plain_sum():
    """``_checksum_ok`` (the sum found modulo 65521 and 255) accepts exactly the headers whose checksum
    field equals the plain sum of their bytes: real headers, each with one byte changed, random blocks."""
    import random

    def plain(head: bytes) -> bool:
        try:
            stored = int(head[148:156].split(b"\0", 1)[0].strip() or b"-1", 8)
        except ValueError:
            return False
        return stored == sum(head) - sum(head[148:156]) + 8 * 32

    rng, changed = random.Random(3), 0
    for _ in range(500):
        info = tarfile.TarInfo("n" * rng.randint(1, 99))
        info.size, info.mtime = rng.randrange(8 ** 11), rng.randrange(8 ** 11)
        head = info.tobuf(tarfile.USTAR_FORMAT)[:512]
        assert _tarwalk._checksum_ok(head)
        for k in rng.sample(range(512), 8):
            bad = bytearray(head)
            bad[k] = rng.randrange(256)
            changed += bad != head
            assert _tarwalk._checksum_ok(bytes(bad)) == plain(bytes(bad))
        block = rng.randbytes(512)
        assert _tarwalk._checksum_ok(block) == plain(block)
    assert changed > 3500
