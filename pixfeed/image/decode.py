"""The one place where stored bytes become pixels.

Rules, the same at pack time (``--store pixels``) and at read time (encoded):

1. Only the JPEG, PNG and WebP decoders are ever run, chosen from the file's
   magic bytes (WebP: ``RIFF`` and form type ``WEBP``), never from its name or
   from anything a dataset says.  An animated WebP gives its first frame.
2. Pillow's decompression-bomb limit stays on (``max_pixels``, default
   ``PIL.Image.MAX_IMAGE_PIXELS``); larger images raise ImageDecodeError, and
   so do JPEGs that ``jpeghead.refusal`` names (not 8-bit, over ``MAX_SCANS``
   scans), before any decode.  Decoders' warnings go to the log
   (``pillow.library_warnings``), never to the terminal.  ICC profiles are
   ignored (pixels as stored, as Pillow's ``convert`` gives them).
3. EXIF orientation (tags 2-8) is applied (``ImageOps.exif_transpose``).
4. Conversion to RGB: grayscale is replicated to three channels; palette
   images are expanded; alpha is dropped (colour channels kept as stored, as
   ``PIL.Image.convert("RGB")`` and torchvision's ImageFolder do); CMYK and
   YCCK JPEGs go through Pillow's CMYK->RGB conversion; 16-bit images keep
   their high byte (``v >> 8``).
5. Resizing uses Pillow's antialiased bilinear filter, with the geometry and
   rounding of torchvision (``pixfeed.image.geometry``):
   ``crop``    scale so the image covers HxW / crop_ratio (short side to
               floor(S / crop_ratio), long side truncated), then center crop;
   ``pad``     scale so the image fits in HxW, center it on black;
   ``stretch`` scale to exactly HxW;
   ``crop="random"``: RandomResizedCrop's box, cropped then resized, then a
   horizontal flip with probability 1/2.
   The output is a C-contiguous uint8 array of shape H x W x 3.
6. Two paths follow these rules, chosen by ``exact`` (False by default, in
   ``decode`` as in the datasets).  ``exact=True`` (packing and verify always
   pass it) is Pillow throughout, pixel-exact with torchvision's Pillow
   transforms.  ``exact=False`` is ``_fastdecode``: simplejpeg when installed,
   DCT-domain downscaling, torch's uint8 antialiased resize; same rules 1-4 and
   geometry, pixels within PSNR >= 35 dB of the exact path (identical when
   ``size`` is None).
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from PIL import Image

from . import geometry
from ..errors import ImageDecodeError, OptionError
from .fast import decode_fast
from .geometry import Plan, Size, check_crop_ratio
from .jpeghead import probe
from .pillow import (EXTENSIONS, FORMATS, apply_plan, check_limit, library_warnings, open_image, pixel_limit, sniff,
                     to_rgb)

__all__ = [  # what the rest of pixfeed takes from here (pillow's primitives re-exported)
    "CROP_MODES", "CROP_RATIO", "EXTENSIONS", "FORMATS", "RESIZE_MODES", "Size", "apply_plan", "check_encoded",
    "check_limit", "decode", "decode_for_pack", "library_warnings", "open_image", "oriented_size", "parse_size",
    "pixel_limit",
    "probed", "random_resized_crop", "resize", "sniff", "to_rgb"]

RESIZE_MODES = ("crop", "pad", "stretch")
CROP_MODES = ("center", "random")
CROP_RATIO = 224 / 256  # the evaluation transform: Resize(256) + CenterCrop(224)


def parse_size(value) -> Optional[Size]:
    """``256`` or ``"256"`` -> (256, 256); ``"224x192"`` -> (224, 192) as (H, W)."""
    if value is None or isinstance(value, tuple):
        return value
    text = str(value).lower()
    try:
        parts = [int(p) for p in text.split("x")] if "x" in text else [int(text)] * 2
    except ValueError:
        parts = []
    if len(parts) != 2 or min(parts) < 1:
        raise OptionError(f"size {value!r}: expected a positive integer S or HxW, e.g. 256 or 224x192")
    return parts[0], parts[1]


def resize(img: Image.Image, size: Size, mode: str = "crop", crop_ratio: float = 1.0) -> Image.Image:
    """Resize an RGB image to exactly ``size`` (H, W) by ``mode`` (see ``geometry``)."""
    if mode not in RESIZE_MODES:
        raise OptionError(f"resize mode {mode!r}: expected one of {', '.join(RESIZE_MODES)}")
    return apply_plan(img, geometry.plan(*img.size, size, mode, crop_ratio=crop_ratio), size)


def random_resized_crop(img: Image.Image, size: Size, rng: np.random.Generator) -> Image.Image:
    """torchvision's RandomResizedCrop plus a horizontal flip with probability 1/2."""
    return apply_plan(img, geometry.plan(*img.size, size, crop="random", rng=rng), size)


def decode(data: bytes, *, size: Optional[Size] = None, resize_mode: str = "crop", crop: str = "center",
           crop_ratio: float = CROP_RATIO, rng: Optional[np.random.Generator] = None, where: str = "<bytes>",
           max_pixels: Optional[int] = None, exact: bool = False, plan: Optional[Plan] = None) -> np.ndarray:
    """Decode JPEG, PNG or WebP bytes to a C-contiguous uint8 HxWx3 RGB array (possibly read-only).

    ``size`` None keeps the decoded size.  ``crop="center"`` with ``resize_mode``
    "crop" is torchvision's ``Resize(floor(S / crop_ratio))`` + ``CenterCrop(S)``;
    ``crop="random"`` (training) takes RandomResizedCrop + flip drawn from ``rng``.
    ``exact=True`` is Pillow throughout (rule 6); the default is the fast path.  ``plan``: the
    geometry drawn already (``plan_for``), so that fields can follow the image's.
    """
    if crop not in CROP_MODES:
        raise OptionError(f"crop {crop!r}: expected one of {', '.join(CROP_MODES)}")
    if size is not None and crop == "center" and resize_mode not in RESIZE_MODES:
        raise OptionError(f"resize mode {resize_mode!r}: expected one of {', '.join(RESIZE_MODES)}")
    crop_ratio = check_crop_ratio(crop_ratio)
    rng = rng if rng is not None or crop != "random" else np.random.default_rng()
    with library_warnings(where=where):  # Pillow's warnings to the log, not the terminal
        if not exact:
            return decode_fast(data, size, resize_mode, crop, crop_ratio, rng, where, max_pixels, plan)
        img = to_rgb(open_image(data, where, max_pixels), where)
        if size is not None:
            p = plan or geometry.plan(*img.size, size, resize_mode, crop, rng, crop_ratio)
            img = apply_plan(img, p, size)
        return np.asarray(img, dtype=np.uint8)


def decode_for_pack(data: bytes, size: Size, resize_mode: str, where: str,
                    max_pixels: Optional[int] = None) -> Tuple[np.ndarray, Size, Plan]:
    """The exact path's pixels at ``size`` (as ``decode``), the (H, W) of the source image
    after EXIF orientation, which a pack records without decoding it twice, and the plan
    that made them (which the record's masks, images and boxes follow)."""
    if resize_mode not in RESIZE_MODES:
        raise OptionError(f"resize mode {resize_mode!r}: expected one of {', '.join(RESIZE_MODES)}")
    img = to_rgb(open_image(data, where, max_pixels), where)
    p = geometry.plan(*img.size, size, resize_mode)
    return np.asarray(apply_plan(img, p, size), dtype=np.uint8), (img.height, img.width), p


def probed(data: bytes, where: str, max_pixels: Optional[int] = None) -> Optional[Size]:
    """(H, W) after EXIF orientation of a JPEG that the fast decoder reads as Pillow does
    (``_jpeghead.probe``: libjpeg-turbo parses its header), its pixel limit checked; None for any
    other file (Pillow's to read)."""
    head = probe(data) if sniff(data) == "JPEG" else None
    if head is None:
        return None
    check_limit(head.width, head.height, where, max_pixels)
    return (head.width, head.height) if head.orientation in (5, 6, 7, 8) else (head.height, head.width)


def oriented_size(data: bytes, where: str, max_pixels: Optional[int] = None) -> Tuple[int, int]:
    """(W, H) of encoded bytes after EXIF orientation, from the header alone."""
    hw = probed(data, where, max_pixels)
    if hw is not None:
        return hw[1], hw[0]
    with library_warnings(where=where):  # Pillow's warnings on a damaged EXIF to the log
        img = open_image(data, where, max_pixels)
        (w, h), orientation = img.size, img.getexif().get(0x0112, 1)
    return (h, w) if orientation in (5, 6, 7, 8) else (w, h)


def _check_jpeg_end(data: bytes, where: str) -> None:
    if data.rstrip(b"\x00")[-2:] != b"\xff\xd9":
        raise ImageDecodeError(f"{where}: truncated JPEG (no end-of-image marker)")


def check_encoded(data: bytes, where: str, max_pixels: Optional[int] = None, full: bool = False) -> Tuple[str, Size]:
    """The pack's acceptance rule, the same for both stores; returns (format, (H, W) after orientation).

    Reads the header, applies the bomb limit and ``jpeghead.refusal`` (12-bit JPEGs, too many scans),
    checks that a JPEG ends with its EOI marker, that a PNG's chunk CRCs are intact up to IEND and
    (``open_image``) that a WebP holds the bytes its RIFF header gives.  ``full`` (``--full-check``,
    and a pixels pack, which decodes anyway) only adds: every pixel decoded as well.  A JPEG that the
    fast decoder reads as Pillow does (``probed``) is not opened with Pillow as well: 8 us an ImageNet
    JPEG against 56.
    """
    with library_warnings(where=where):  # to the log (verify), or to the pack's notes (load_record's block)
        hw = None if full else probed(data, where, max_pixels)  # full: Pillow reads the header it decodes
        if hw is not None:
            _check_jpeg_end(data, where)
            fmt = "JPEG"
        else:
            fmt, hw = _check_with_pillow(data, where, max_pixels)
        if full:
            hw = decode(data, where=where, max_pixels=max_pixels, exact=True).shape[:2]
        return fmt, hw


def _check_with_pillow(data: bytes, where: str, max_pixels: Optional[int]) -> Tuple[str, Size]:
    img = open_image(data, where, max_pixels)
    fmt, (w, h) = img.format, img.size
    if fmt == "JPEG":
        _check_jpeg_end(data, where)
    try:  # reading a PNG's EXIF loads the image, so it fails on damage too
        if fmt == "PNG":
            open_image(data, where, max_pixels).verify()
        orientation = img.getexif().get(0x0112, 1)
    except Exception as e:
        raise ImageDecodeError(f"{where}: damaged {fmt} ({type(e).__name__}: {e})") from None
    if orientation in (5, 6, 7, 8):
        w, h = h, w
    return fmt, (h, w)
