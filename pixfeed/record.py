"""One stored record as a single buffer: a fixed header, then the stored bytes.

This is the value layout of the LMDB format (``pixfeed.packers.lmdb``); any
language can parse it.  The header is 40 bytes, little-endian, struct format
``"<4sBBHqQIIQ"``::

    offset  size  type     field
     0      4     bytes    magic     b"PXFR"
     4      1     uint8    version   1
     5      1     uint8    kind      0 raw (H x W x 3 uint8 RGB pixels), 1 jpeg, 2 png
     6      2     uint16   reserved  0
     8      8     int64    label     class index, -1 for a flat source
    16      8     uint64   checksum  xxh3_64 of the stored bytes
    24      4     uint32   height    H of the decoded image (after EXIF orientation)
    28      4     uint32   width     W
    32      8     uint64   length    number of stored bytes that follow (raw: H * W * 3)
    40      ...            the stored bytes (8-byte aligned)

``parse`` checks every structural field and raises CorruptDataError naming
the record on any malformed buffer; it does not check the checksum (readers
do that, see ``pixfeed.datasets.base``).
"""
from __future__ import annotations

import struct
from typing import NamedTuple, Tuple

from .errors import CorruptDataError

HEADER = struct.Struct("<4sBBHqQIIQ")
MAGIC = b"PXFR"
VERSION = 1
KINDS = ("raw", "jpeg", "png")


class Header(NamedTuple):
    kind: str       # "raw" | "jpeg" | "png"
    label: int
    checksum: int
    height: int
    width: int
    length: int


def pack_header(kind: str, label: int, checksum: int, shape: Tuple[int, int], length: int) -> bytes:
    """The 40-byte header of a record whose ``length`` stored bytes follow it."""
    return HEADER.pack(MAGIC, VERSION, KINDS.index(kind), 0, label, checksum, shape[0], shape[1], length)


def parse(buf, where: str) -> Tuple[Header, memoryview]:
    """Split a record buffer into its checked header and a view of its stored bytes.

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
    if version != VERSION:
        _fail(where, f"record version {version} is not supported (this pixfeed reads version {VERSION})")
    if kind >= len(KINDS) or reserved:
        _fail(where, f"unknown record kind {kind} (reserved field {reserved})")
    if h < 1 or w < 1:
        _fail(where, f"image shape {h}x{w} is empty")
    if length != len(view) - HEADER.size or (KINDS[kind] == "raw" and length != h * w * 3):
        _fail(where, f"header says {length} stored bytes of a {h}x{w} {KINDS[kind]} image, "
                     f"but {len(view) - HEADER.size} bytes follow")
    return Header(KINDS[kind], label, checksum, h, w, length), view[HEADER.size:]


def _fail(where: str, reason: str) -> None:
    raise CorruptDataError(f"{where}: malformed record: {reason}")
