"""What the fast decode path reads from a JPEG before decoding it: size,
colour space and EXIF orientation, without Pillow and without touching pixels.

``probe`` answers only for JPEGs that simplejpeg (libjpeg-turbo, the library
Pillow's wheels decode with too) turns into exactly the pixels Pillow does:
YCbCr and grayscale, baseline or progressive, with an orientation read the way
Pillow reads it (the first ``Exif`` APP1 segment, else XMP's
``tiff:Orientation``).  Anything else (CMYK, YCCK, Adobe RGB, a damaged or
unusual header, an XMP orientation) gets None and goes through Pillow.

``refusal`` says why no path may decode a JPEG, from its markers alone, for the
pack's check and every read path alike (``pillow.open_image`` raises it, and
``probe`` leaves such a file to it): a sample precision other than 8 bits (a
12-bit JPEG's header parses, but neither Pillow nor simplejpeg decodes it), or
more than ``MAX_SCANS`` scans (start-of-scan markers, counted before decoding:
each scan of a progressive JPEG is a pass over every block, so a file cut into
thousands of tiny scans took minutes to decode; libjpeg-turbo's scan limit).
"""
from __future__ import annotations

import struct
from typing import NamedTuple, Optional

import numpy as np

try:  # optional extra: pip install pixfeed[fast]
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

FAST_COLORSPACES = ("YCbCr", "Gray")
MAX_SCANS = 100  # encoders write 1 (baseline) to about 10-20 (progressive) scans
_SOS, _EOI, _APP1 = 0xDA, 0xD9, 0xE1
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers (C4: DHT, C8: JPG, CC: DAC)
_SEQUENTIAL = (0xC0, 0xC1, 0xC9)  # baseline, extended and arithmetic-coded sequential frames
_SOS_WORD = np.dtype("<u2").type(0xDAFF)  # the bytes FF DA read as one little-endian 16-bit word
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
    if colorspace not in FAST_COLORSPACES or refusal(data) is not None:
        return None
    orientation = exif_orientation(data)
    return None if orientation is None else JpegHead(height, width, orientation)


def refusal(data) -> Optional[str]:
    """Why no decode path takes this JPEG (the module's docstring), else None.  The scans of a sequential
    JPEG whose first scan holds every component are not counted (most photos: libjpeg-turbo, under Pillow
    and simplejpeg alike, refuses a second scan there), nor those of a header it cannot parse."""
    sof, precision, components, first_scan = frame(data)
    if precision is not None and precision != 8:
        return (f"{precision}-bit JPEG (sample precision {precision}): only 8-bit JPEGs are decoded; "
                "convert it (to an 8-bit JPEG, or a 16-bit PNG) to keep it")
    if sof in _SEQUENTIAL and first_scan == components:
        return None
    scans = count_scans(data)
    if scans > MAX_SCANS:
        return (f"JPEG of {scans} scans (start-of-scan markers), more than the {MAX_SCANS} pixfeed decodes: "
                "each scan is a pass over the whole image; re-encode it (jpegtran -optimize) to keep it")
    return None


def frame(data) -> tuple:
    """(start-of-frame marker, bits per sample, components, components of the first scan) from the
    header; None for what is not found before the first scan (the decoder then says what is wrong)."""
    sof = precision = components = None
    for marker, pos in _markers(data):
        if marker in _SOF and sof is None and pos + 9 < len(data):
            sof, precision, components = marker, data[pos + 4], data[pos + 9]
        elif marker == _SOS:
            return sof, precision, components, data[pos + 4] if pos + 4 < len(data) else None
    return sof, precision, components, None


def count_scans(data) -> int:
    """Start-of-scan markers (FF DA) in ``data``: its scans, plus those of any thumbnail it holds (in
    entropy-coded data an FF byte is followed by 00 or a restart marker, never DA).  A vectorised count
    of both byte alignments: 17 us for a 100 KB photo, against 86 for ``bytes.count``."""
    n = len(data)
    words = np.frombuffer(data, "<u2", count=n // 2)
    odd = np.frombuffer(data, "<u2", count=(n - 1) // 2, offset=1) if n > 2 else words[:0]
    return int(np.count_nonzero(words == _SOS_WORD) + np.count_nonzero(odd == _SOS_WORD))


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
    for marker, pos in _markers(data):
        if marker is None:
            yield None
        elif marker == _APP1:  # as bytes: ``in`` on a memoryview would look for an element, not a run
            yield bytes(data[pos + 4: pos + 2 + struct.unpack_from(">H", data, pos + 2)[0]])


def _markers(data):
    """Yield (marker, position) of each segment up to the first scan's (SOS, the last yielded);
    (None, position) for a malformed header (the walk then ends)."""
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            yield None, pos
            return
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == _EOI:
            return
        yield marker, pos
        if marker == _SOS:
            return
        pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
    yield None, pos


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
