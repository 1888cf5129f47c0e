"""``image`` and ``mask`` fields: a second image, and a single-channel label image.

Both follow the main image's geometry: they must have its size (after EXIF
orientation), or the pack fails naming both files, and get exactly its
resize, crop box and flip (``pixfeed.image.geometry.Plan``).  A mask is resized with
nearest neighbour (labels are never blended) and stored losslessly: an HxW
uint8 array in pixels mode, a grayscale PNG in encoded mode.  A second image
is stored as the main image is: RGB pixels, or its own JPEG/PNG bytes.
Mask files may be grayscale (L), palette (P: the palette indices are the
labels, as in Pascal VOC), 1-bit, or 16-bit with values below 256.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

from ..image.decode import apply_plan, check_encoded, open_image, to_rgb
from ..errors import ImageDecodeError
from ..image.geometry import Plan, Size


def load_mask(data: bytes, where: str, max_pixels=None) -> np.ndarray:
    """The HxW uint8 labels of a mask file (oriented as its image would be)."""
    img = open_image(data, where, max_pixels)
    try:
        img.load()
        img = ImageOps.exif_transpose(img)
    except Exception as e:
        raise ImageDecodeError(f"{where}: cannot decode mask ({type(e).__name__}: {e})") from None
    if img.mode not in ("L", "P", "1", "I", "I;16", "I;16B", "I;16L"):
        raise ImageDecodeError(f"{where}: a mask must be a single-channel image (grayscale, palette or 16-bit), "
                               f"not {img.mode}")
    arr = np.asarray(img.convert("L") if img.mode == "1" else img)
    if arr.dtype != np.uint8:
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise ImageDecodeError(f"{where}: mask values {arr.min()}..{arr.max()} do not fit in uint8")
        arr = arr.astype(np.uint8)
    return arr


def encode_mask(arr: np.ndarray) -> bytes:
    return encode_png(Image.fromarray(np.ascontiguousarray(arr, np.uint8), "L"))


def encode_png(picture) -> bytes:
    """A uint8 array or a PIL image as a lossless PNG (a mode PNG cannot hold, such as CMYK, YCbCr or F,
    as RGB, by the decode rules)."""
    img = picture if isinstance(picture, Image.Image) else Image.fromarray(np.ascontiguousarray(picture))
    buf = io.BytesIO()
    try:
        img.save(buf, "PNG", compress_level=1)
    except OSError:
        buf = io.BytesIO()
        img.convert("RGB").save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def check_size(kind: str, shape, image_shape, where: str, image_where: str) -> None:
    """Raise unless a mask or second image of ``shape`` (H, W) matches its image's."""
    if tuple(shape) != tuple(image_shape):
        raise ImageDecodeError(f"{where}: the {kind} is {shape[1]}x{shape[0]} but its image {image_where} is "
                               f"{image_shape[1]}x{image_shape[0]}; a {kind} must have its image's size")


def mask_pixels(arr: np.ndarray, p: Plan, size: Size) -> np.ndarray:
    """A mask through the image's plan, nearest neighbour (the background of a pad is 0)."""
    return np.asarray(apply_plan(Image.fromarray(arr, "L"), p, size, Image.NEAREST))


def pack_mask(data: bytes, p, size, store: str, image_shape, where: str, image_where: str, max_pixels=None) -> bytes:
    """A mask's stored bytes: through ``p`` (pixels mode, a ``--max-side`` re-encode) when given,
    then HxW pixels (pixels mode) or a PNG (encoded mode)."""
    arr = load_mask(data, where, max_pixels)
    check_size("mask", arr.shape, image_shape, where, image_where)
    if p is not None:
        arr = mask_pixels(arr, p, size)
    return np.ascontiguousarray(arr).tobytes() if store == "pixels" else encode_mask(arr)


def pack_image(data: bytes, p, size, store: str, image_shape, where: str, image_where: str, max_pixels=None,
               quality: int = 90) -> bytes:
    """A second image's stored bytes: HxWx3 pixels through ``p`` (pixels mode), its own bytes (encoded
    mode), or a JPEG through ``p`` (encoded mode re-encoded by ``--max-side``)."""
    if store == "encoded" and p is None:
        _, shape = check_encoded(data, where, max_pixels)
        check_size("image", shape, image_shape, where, image_where)
        return data
    img = to_rgb(open_image(data, where, max_pixels), where)
    check_size("image", (img.height, img.width), image_shape, where, image_where)
    img = apply_plan(img, p, size)
    if store == "pixels":
        return np.ascontiguousarray(img, np.uint8).tobytes()
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()
