"""The fused read-time path behind ``decode(..., exact=False)``.

Same rules and geometry (``geometry.plan``) as the exact path in ``decode.py``;
four things differ:

1. JPEGs that ``_jpeghead.probe`` accepts are decoded by simplejpeg (when
   installed) into RGBX, with libjpeg-turbo's fast integer IDCT and plain chroma
   upsampling when a resize shrinks an image of at least ``FAST_IDCT_PIXELS`` (as
   FFCV decodes; 10% faster, and the resize's low-pass hides the difference), its
   accurate IDCT and fancy upsampling (Pillow's) when the image is kept or enlarged
   (``reduced``), or small; everything else by Pillow, with ``to_rgb``'s rules.
2. DCT-domain downscaling: a JPEG is decoded at 1/2, 1/4 or 1/8 scale when
   that still leaves ``DCT_MARGIN`` times the output resolution, so the
   antialiased resize that follows still does the low-pass filtering (at a
   margin of 1 the result drifted to 31 dB PSNR from Pillow's on real photos).
   A random box whose corner falls between the pixels of that scale is
   resized by Pillow with its fractional edges (``subpixel_box``): the crop
   stays on the drawn box (within 1/100 of an output pixel, measured), where
   rounding it to the grid moved it by up to a quarter of an output pixel.
3. Random crops of such JPEGs decode only their box when the optional
   ``pixfeed[region]`` extra is installed (``_regiondecode``).
4. One uint8 antialiased bilinear resize by torch (AVX2 kernels, 3-4x faster
   than Pillow's), with the scale given explicitly so that output pixel
   centres fall where Pillow's do; center crops resize the image up to the
   far edges of the kept window (``kept``: the same pixels) and slice,
   random crops resize only the box (as torchvision and the exact path do:
   crop, then resize).

Tolerance against the exact path (checked in tests/test_decode.py, measured in
benchmarks/bench_decode.py): PSNR >= 35 dB; on 500 ImageNet photos at 224 the
minimum is 39.6 dB and the median 44.5 dB for center crops, 37.8 and 46.4 for
random crops decoded whole (64: 42.0 and 40.1; enlarged to 512: 40.2 center),
and every file of tests/wild.py is above 35.  Without ``size`` the pixels are exact.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from . import jpeghead as _jpeghead, region as _regiondecode
from .pillow import check_limit, open_image, sniff, to_rgb
from .geometry import Plan, Size, plan
from ..errors import ImageDecodeError

DCT_MARGIN = 2
FAST_IDCT_PIXELS = 256 * 256  # below that, the accurate IDCT costs little and the fast one showed (35.7 dB, an
# 88x31 banner shrunk to 8x8)
_ORIENT = {2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1], 4: lambda a: a[::-1],
           5: lambda a: a.transpose(1, 0, 2), 6: lambda a: np.rot90(a, -1),
           7: lambda a: a[::-1, ::-1].transpose(1, 0, 2), 8: lambda a: np.rot90(a, 1)}


def dct_divisor(p: Plan) -> int:
    """The largest of 8, 4, 2, 1 that keeps DCT_MARGIN x the output's pixels in the box."""
    bw, bh = p.src
    for d in (8, 4, 2):
        if bw / d >= DCT_MARGIN * p.scaled[0] and bh / d >= DCT_MARGIN * p.scaled[1]:
            return d
    return 1


def decode_fast(data: bytes, size: Optional[Size], resize_mode: str, crop: str, crop_ratio: float, rng,
                where: str, max_pixels: Optional[int], fixed: Optional[Plan] = None) -> np.ndarray:
    """Decode to a C-contiguous uint8 H x W x 3 array by the fast path (``fixed``: the plan, drawn already)."""
    head = _jpeghead.probe(data) if sniff(data) == "JPEG" else None
    img = None
    if head is None:
        img = open_image(data, where, max_pixels)
        (w, h), orientation = img.size, _pil_orientation(img, where)
    else:
        check_limit(head.width, head.height, where, max_pixels)
        w, h, orientation = head.width, head.height, head.orientation
    w, h = (h, w) if orientation in (5, 6, 7, 8) else (w, h)
    p = fixed or (plan(w, h, size, resize_mode, crop, rng, crop_ratio) if size is not None else None)
    d = dct_divisor(p) if p is not None else 1
    box = _region(data, head, p, d, orientation, where) if head is not None and p is not None else None
    if box is not None:
        return finish(box, 1, p._replace(box=(0, 0, *p.src)), size)
    fast = reduced(p) and w * h >= FAST_IDCT_PIXELS
    arr = _simplejpeg(data, head, d, orientation, fast=fast) if head is not None else None
    if arr is None:  # not for simplejpeg, or libjpeg-turbo complained: Pillow decides
        arr, d = _pillow(img or open_image(data, where, max_pixels), d, where)
    if p is not None:
        return finish(arr, d, p, size)
    return arr if arr.shape[2] == 3 else rgb_copy(arr, np.empty((*arr.shape[:2], 3), np.uint8))


def finish(arr: np.ndarray, d: int, p: Plan, size: Size) -> np.ndarray:
    """Resize the plan's box of ``arr`` (decoded at 1/d scale) and crop, pad or flip it."""
    region = arr
    if p.box is not None and d > 1 and (p.box[0] % d or p.box[1] % d):
        region, d = subpixel_box(arr, d, p), 1  # the box, already at p.scaled
    elif p.box is not None:
        x0, y0, x1, y1 = (round(v / d) for v in p.box)
        region = arr[y0:y1, x0:x1]
    (sw, sh), (H, W), (ox, oy) = p.scaled, size, p.offset
    if d > 1 or region.shape[:2] != (sh, sw):
        scales = (sh * d / p.src[1], sw * d / p.src[0])
        if sw >= W and sh >= H:  # a crop: what lies right of and below the kept window is not made
            (sh, rows), (sw, cols) = (kept(o + n, s, size, scale) for o, n, s, size, scale in
                                      zip((oy, ox), (H, W), (sh, sw), region.shape[:2], scales))
            region = region[:rows, :cols]
        region = resize_uint8(region, (sw, sh), scales)
    if sw >= W and sh >= H:
        view = region[oy:oy + H, ox:ox + W]
        return rgb_copy(view[:, ::-1] if p.flip else view, np.empty((H, W, 3), np.uint8))
    out = np.zeros((H, W, 3), np.uint8)
    rgb_copy(region, out[oy:oy + sh, ox:ox + sw])
    return contiguous(out[:, ::-1] if p.flip else out)


def subpixel_box(arr: np.ndarray, d: int, p: Plan) -> np.ndarray:
    """The plan's box of ``arr`` (decoded at 1/d scale) resized to ``p.scaled``, its edges where they fall
    between decoded pixels: Pillow's resize of a fractional box, the filter clipped to the decoded
    pixels the box touches, as the exact path's crop clips it.  Rounding the box to the 1/d grid
    instead moved the crop by up to d/2 source pixels (a quarter of an output pixel)."""
    from PIL import Image

    x0, y0, x1, y1 = (v / d for v in p.box)
    ix0, iy0 = int(x0), int(y0)
    ix1, iy1 = min(math.ceil(x1), arr.shape[1]), min(math.ceil(y1), arr.shape[0])
    hull = np.ascontiguousarray(arr[iy0:iy1, ix0:ix1])
    mode = "RGBX" if hull.shape[2] == 4 else "RGB"
    img = Image.frombuffer(mode, (hull.shape[1], hull.shape[0]), hull, "raw", mode, 0, 1)
    box = (x0 - ix0, y0 - iy0, min(x1, ix1) - ix0, min(y1, iy1) - iy0)
    return np.asarray(img.resize(p.scaled, Image.BILINEAR, box=box))


def reduced(p: Optional[Plan]) -> bool:
    """Whether plan ``p`` shrinks its box along both axes: only then does the fast IDCT and plain chroma
    upsampling's error vanish under the resize's low-pass (an enlarged small JPEG showed it: 30 dB)."""
    return p is not None and p.scaled[0] < p.src[0] and p.scaled[1] < p.src[1]


def kept(end: int, out: int, size: int, scale: float) -> Tuple[int, int]:
    """Along one axis of an antialiased bilinear resize of ``size`` pixels to ``out`` by ``scale``:
    (outputs, inputs) to make so that the first ``end`` outputs come out the same.  Each output's
    weights depend only on the scale and its own centre, so when shrinking (scale < 1) resizing
    just the inputs the first ``end`` read gives those pixels (torch's kernel has no offset, so only
    the far side can be left out); otherwise the whole axis (torch skips an axis whose input and
    output sizes are equal, whatever the scale)."""
    if scale >= 1.0:
        return out, size
    return end, min(size, int((end - 0.5) / scale + 1.0 / scale + 0.5) + 1)


def rgb_copy(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Copy the first three channels of ``src`` (RGB or RGBX) into ``out``, one channel
    at a time: numpy's strided copy of 3 of every 4 bytes is 5x slower."""
    for c in range(3):
        out[..., c] = src[..., c]
    return out


def resize_uint8(arr: np.ndarray, wh: Tuple[int, int], scales: Tuple[float, float]) -> np.ndarray:
    """Antialiased bilinear resize of an H x W x C uint8 array to ``wh``, mapping
    output pixel centres through ``scales`` (output / input, as Pillow's box does).
    The output is written H x W x C (channels-last, as the input): torch's AVX2 kernel
    then skips its planar repacking, half the resize's time for RGBX.  A strided input (a crop's
    view) is copied by NumPy first: torch copies it on its OpenMP threads, which a process forked
    after they started never gets back (the resize then waits for ever), and which spin beside the
    decode threads."""
    out = np.empty((wh[1], wh[0], arr.shape[2]), np.uint8)
    import torch  # here, not at the top: packing decodes without loading torch

    x, y = (torch.from_numpy(a).permute(2, 0, 1).unsqueeze(0) for a in (contiguous(arr), out))
    torch.ops.aten._upsample_bilinear2d_aa.out(x, [wh[1], wh[0]], False, scales[0], scales[1], out=y)
    return out


def contiguous(arr: np.ndarray) -> np.ndarray:
    """``arr`` as a C-contiguous array with no negative stride (what ``torch.from_numpy`` takes):
    ``np.ascontiguousarray`` keeps a flipped view whose negative stride lies on an axis of length 1
    (a 1-pixel-wide image turned by its EXIF orientation), which torch refuses."""
    if arr.flags.c_contiguous and min(arr.strides, default=0) >= 0:
        return arr
    return np.array(arr, order="C", copy=True)


def _pil_orientation(img, where: str) -> int:
    try:
        return int(img.getexif().get(0x0112, 1))
    except Exception as e:
        raise ImageDecodeError(f"{where}: cannot read EXIF ({type(e).__name__}: {e})") from None


def _region(data: bytes, head: _jpeghead.JpegHead, p: Plan, d: int, orientation: int,
            where: str) -> Optional[np.ndarray]:
    """The plan's random box decoded alone and oriented (``_regiondecode``); None: decode the whole image."""
    if p.box is None or not _regiondecode.ENABLED:
        return None
    if d > 1:
        _regiondecode.count("full: DCT scaling")
        return None
    arr = _regiondecode.decode_box(data, p.box, head.width, head.height, orientation, where)
    if arr is None or orientation not in _ORIENT:
        return arr
    return contiguous(_ORIENT[orientation](arr))


def _simplejpeg(data: bytes, head: _jpeghead.JpegHead, d: int, orientation: int,
                fast: bool) -> Optional[np.ndarray]:
    """RGBX pixels at 1/d scale, oriented; None when libjpeg-turbo reports a problem.
    ``fast``: libjpeg-turbo's fast integer IDCT and plain chroma upsampling."""
    try:
        arr = _jpeghead.simplejpeg.decode_jpeg(data, "RGBX", fastdct=fast, fastupsample=fast,
                                                min_height=-(-head.height // d),
                                                min_width=-(-head.width // d))
    except ValueError:
        return None
    return contiguous(_ORIENT[orientation](arr)) if orientation in _ORIENT else arr


def _pillow(img, d: int, where: str) -> Tuple[np.ndarray, int]:
    """Pillow decode by ``to_rgb``'s rules, DCT-scaled by up to 1/d; returns the array and the d used."""
    width = img.size[0]
    drafted = img.draft(None, (width // d, img.size[1] // d)) if d > 1 and img.format == "JPEG" else None
    d = round(width / drafted[1][2]) if drafted else 1
    return np.array(to_rgb(img, where)), d
