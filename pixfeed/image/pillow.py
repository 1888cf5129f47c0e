"""Pillow's side of the decode rules (``decode``'s docstring): the format allow-list read from the
magic bytes, the decompression-bomb limit, EXIF orientation and RGB conversion, and the rendering
of a geometry ``Plan``.  Both decode paths (``decode``'s exact one and ``fast``) stand on these."""
from __future__ import annotations

import io
import logging
import re
import threading
import warnings
from contextlib import contextmanager
from typing import List, Optional

import numpy as np
from PIL import Image, ImageOps

from ..errors import ImageDecodeError
from . import jpeghead
from .geometry import Plan, Size

FORMATS = {"JPEG": b"\xff\xd8\xff", "PNG": b"\x89PNG\r\n\x1a\n", "WEBP": b"RIFF"}  # WebP: RIFF....WEBP
EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}
NAMES = "JPEG, PNG or WebP"  # what the allow-list holds, for messages
log = logging.getLogger("pixfeed.image")


def sniff(data: bytes) -> Optional[str]:
    """The image format named by the magic bytes ("JPEG", "PNG" or "WEBP": a RIFF container of form
    type ``WEBP``), else None."""
    for name, magic in FORMATS.items():
        if data[: len(magic)] == magic and (name != "WEBP" or data[8:12] == b"WEBP"):
            return name
    return None


def check_webp_length(data: bytes, where: str) -> None:
    """A WebP's RIFF header gives the bytes that follow it: fewer is a truncated file (Pillow decodes
    what there is of some without a word), more is what a RIFF reader ignores."""
    declared = int.from_bytes(bytes(data[4:8]), "little") + 8
    if len(data) < declared:
        raise ImageDecodeError(f"{where}: truncated WebP ({len(data)} bytes of the {declared} its RIFF header gives)")


# what a file that is no allowed image is, from its first bytes, for messages that quote none of them (a
# note in a manifest must not carry a file's content: docs/untrusted-data.md)
_KINDS = ((b"GIF8", "a GIF image"), (b"BM", "a BMP image"), (b"II*\0", "a TIFF image"), (b"MM\0*", "a TIFF image"),
          (b"%PDF", "a PDF document"), (b"PK\3\4", "a ZIP archive"), (b"\x1f\x8b", "a gzip file"),
          (b"RIFF", "a RIFF file that is not WebP"), (b"\0\0\0", "an ISO media file (HEIC, AVIF, MP4?)"),
          (b"<", "markup text (HTML, XML, SVG?)"), (b"{", "JSON text?"))


def _kind(data) -> str:
    """What ``data`` looks like, named without quoting it: its first bytes match no image format."""
    head = bytes(data[:8])
    kind = next((k for magic, k in _KINDS if head.startswith(magic)), None)
    if kind is None:
        kind = "plain text" if all(32 <= b < 127 or b in b"\t\r\n" for b in head) else None
    return f"{'it looks like ' + kind if kind else 'its first bytes match no known format'}; {len(data):,} bytes"


def open_image(data: bytes, where: str, max_pixels: Optional[int] = None) -> Image.Image:
    """Open JPEG, PNG or WebP bytes with Pillow, enforcing the format allow-list and the bomb limit."""
    if not data:
        raise ImageDecodeError(f"{where}: empty file (0 bytes)")
    fmt = sniff(data)
    if fmt is None:
        raise ImageDecodeError(f"{where}: not a {NAMES} file ({_kind(data)})")
    if fmt == "WEBP":
        check_webp_length(data, where)
    if fmt == "JPEG" and (reason := jpeghead.refusal(data)) is not None:
        raise ImageDecodeError(f"{where}: {reason}")
    limit = pixel_limit(max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=[fmt])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        if limit is None or limit > (Image.MAX_IMAGE_PIXELS or 0):
            img = _open_unbounded(data, fmt, where)
        else:
            # one limit quoted, the one in force (Pillow's message gives its own, or twice it for an error)
            pixels = re.search(r"\((\d+) pixels\)", str(e))
            raise ImageDecodeError(f"{where}: {pixels.group(1) + ' pixels' if pixels else 'the image'} exceeds the "
                                   f"decompression-bomb limit of {limit} pixels; raise it with --max-pixels if the "
                                   "image is trusted") from None
    except Exception as e:  # Pillow raises many types on bad headers
        raise _header_error(where, fmt, e) from None
    check_limit(*img.size, where, max_pixels)
    return img


def pixel_limit(max_pixels: Optional[int] = None) -> Optional[int]:
    """The decompression-bomb limit ``max_pixels`` means: Pillow's own for None (None: no limit)."""
    return Image.MAX_IMAGE_PIXELS if max_pixels is None else max_pixels


def check_limit(w: int, h: int, where: str, max_pixels: Optional[int] = None) -> None:
    """Raise ImageDecodeError when w x h exceeds the decompression-bomb limit."""
    limit = pixel_limit(max_pixels)
    if limit is not None and w * h > limit:
        raise ImageDecodeError(f"{where}: {w}x{h} = {w * h} pixels exceeds the decompression-bomb limit of "
                               f"{limit} pixels; raise it with --max-pixels if the image is trusted")


def _header_error(where: str, fmt: str, e: Exception) -> ImageDecodeError:
    """Pillow's message without the in-memory buffer it names (``<_io.BytesIO object at 0x...>``
    differs from run to run and means nothing to the reader)."""
    text = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(e))
    return ImageDecodeError(f"{where}: cannot read {fmt} header ({type(e).__name__}: {text})")


def _open_unbounded(data: bytes, fmt: str, where: str) -> Image.Image:
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        return Image.open(io.BytesIO(data), formats=[fmt])
    except Exception as e:
        raise _header_error(where, fmt, e) from None
    finally:
        Image.MAX_IMAGE_PIXELS = saved


_hold = threading.Lock()
_routing = {"depth": 0, "showwarning": None}
# every one (not once per place), raised in PIL or by PIL for its caller in pixfeed.image (a warnings filter)
_ALWAYS = ("always", None, Warning, re.compile(r"(PIL|pixfeed\.image)(\.|$)"), 0)
_sink = threading.local()  # the list this thread's library warnings go to while ``library_warnings`` runs


@contextmanager
def library_warnings(sink: Optional[List[str]] = None, where: Optional[str] = None):
    """Warnings raised in this thread inside the block (Pillow's: palette transparency, corrupt EXIF) are appended to
    ``sink`` as text (every one, not Python's once per place), never printed; the pack turns them into
    notes; without a ``sink`` they are logged (``pixfeed.image``, level INFO) naming ``where``, as ``decode``
    does at read time.  Nested, the outermost block keeps them.  Thread-safe: the first
    thread in installs one filter and one ``showwarning`` for the process, the last one out removes them;
    other warnings, and other threads' outside such a block, are shown as before."""
    if getattr(_sink, "list", None) is not None:  # nested: the outer block's sink gets them
        yield _sink.list
        return
    logged, sink = sink is None, [] if sink is None else sink
    with _hold:
        if _routing["depth"] == 0:
            warnings.filters.insert(0, _ALWAYS)
            warnings._filters_mutated()
            _routing["showwarning"], warnings.showwarning = warnings.showwarning, _route
        _routing["depth"] += 1
    _sink.list = sink
    try:
        yield sink
    finally:
        _sink.list = None
        with _hold:
            _routing["depth"] -= 1
            if _routing["depth"] == 0:
                if warnings.showwarning is _route:
                    warnings.showwarning = _routing["showwarning"]
                if _ALWAYS in warnings.filters:
                    warnings.filters.remove(_ALWAYS)
                    warnings._filters_mutated()
        for text in sink if logged else ():
            log.info("%s: %s", where or "<bytes>", text)


def _route(message, category, filename, lineno, file=None, line=None):
    sink = getattr(_sink, "list", None)
    if sink is not None:
        sink.append(f"{category.__name__}: {message}")
        return
    shown = _routing["showwarning"] or warnings._showwarning_orig
    shown(message, category, filename, lineno, file, line)


def to_rgb(img: Image.Image, where: str) -> Image.Image:
    """Load, apply EXIF orientation and convert to RGB by the rules above."""
    try:
        img.load()
        img = ImageOps.exif_transpose(img)
        if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
            arr = np.asarray(img).astype(np.int64)
            img = Image.fromarray(np.clip(arr >> 8, 0, 255).astype(np.uint8), "L")
        elif img.mode == "F":
            img = Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8), "L")
        return img if img.mode == "RGB" else img.convert("RGB")
    except ImageDecodeError:
        raise
    except Exception as e:
        raise ImageDecodeError(f"{where}: cannot decode image ({type(e).__name__}: {e})") from None


def apply_plan(img: Image.Image, p: Plan, size: Size, resample=Image.BILINEAR) -> Image.Image:
    """Pillow's rendering of a geometry ``Plan``: crop the box, resize, crop or pad, flip
    (``resample=Image.NEAREST`` for label images: masks)."""
    H, W = size
    if p.box is not None:
        img = img.crop(p.box)
    if img.size != p.scaled:
        img = img.resize(p.scaled, resample)
    (ox, oy), (sw, sh) = p.offset, p.scaled
    if sw >= W and sh >= H:
        img = img if (sw, sh) == (W, H) else img.crop((ox, oy, ox + W, oy + H))
    else:
        canvas = Image.new(img.mode, (W, H))
        canvas.paste(img, (ox, oy))
        img = canvas
    return img.transpose(Image.FLIP_LEFT_RIGHT) if p.flip else img
