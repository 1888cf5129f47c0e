"""What the fast decode path reads from a JPEG before decoding it: size,
colour space and EXIF orientation, without Pillow and without touching pixels.

``probe`` answers only for JPEGs that simplejpeg (libjpeg-turbo, the library
Pillow's wheels decode with too) turns into exactly the pixels Pillow does:
YCbCr and grayscale, baseline or progressive, with an orientation read the way
Pillow reads it (the first ``Exif`` APP1 segment, else XMP's
``tiff:Orientation``).  Anything else (CMYK, YCCK, Adobe RGB, a damaged or
unusual header, an XMP orientation) gets None and goes through Pillow.
"""
from __future__ import annotations

import struct
from typing import NamedTuple, Optional

try:  # optional extra: pip install pixfeed[fast]
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

FAST_COLORSPACES = ("YCbCr", "Gray")
_SOS, _EOI, _APP1 = 0xDA, 0xD9, 0xE1
_ORIENTATION_TAG = 0x0112


class JpegHead(NamedTuple):
    height: int
    width: int
    orientation: int  # EXIF orientation 1-8 (anything else acts as 1)


def probe(data: bytes) -> Optional[JpegHead]:
    """The header of a JPEG that the fast decoder handles exactly, else None."""
    if simplejpeg is None:
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in FAST_COLORSPACES:
        return None
    orientation = exif_orientation(data)
    return None if orientation is None else JpegHead(height, width, orientation)


def exif_orientation(data: bytes) -> Optional[int]:
    """EXIF orientation of a JPEG (1 when absent); None when only Pillow can say."""
    exif, xmp = None, False
    for payload in _app1_segments(data):
        if payload is None:
            return None
        if payload[:6] == b"Exif\x00\x00":
            exif = _tiff_orientation(payload[6:]) if exif is None else exif  # Pillow reads the first
            if exif is None:
                return None
        else:
            xmp = xmp or b"tiff:Orientation" in payload
    if exif:  # a tag in EXIF wins; without one Pillow looks in XMP
        return exif
    return None if xmp else 1


def _app1_segments(data: bytes):
    """Yield each APP1 payload before the first scan; None for a malformed header."""
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            yield None
            return
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (_SOS, _EOI):
            return
        length = struct.unpack_from(">H", data, pos + 2)[0]
        if marker == _APP1:  # as bytes: ``in`` on a memoryview would look for an element, not a run
            yield bytes(data[pos + 4: pos + 2 + length])
        pos += 2 + length
    yield None


def _tiff_orientation(tiff: bytes) -> Optional[int]:
    """Orientation tag of IFD0 in a TIFF blob (0 when absent); None if malformed."""
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return None
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return None
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(tiff):
            return None
        tag, kind = struct.unpack_from(order + "HH", tiff, entry)
        if tag == _ORIENTATION_TAG:
            return struct.unpack_from(order + "H", tiff, entry + 8)[0] if kind == 3 else None
    return 0
