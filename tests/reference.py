"""An independent Pillow reference of pixfeed's documented decode rules (for tests)."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps


def reference_rgb(path) -> Image.Image:
    img = Image.open(path)
    img.load()
    img = ImageOps.exif_transpose(img)
    if img.mode.startswith("I;16") or img.mode == "I":
        img = Image.fromarray((np.asarray(img).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8), "L")
    return img.convert("RGB")


def reference_pixels(path, size: int) -> np.ndarray:
    """Short side to ``size`` (bilinear, antialiased), then a size x size center crop."""
    img = reference_rgb(path)
    w, h = img.size
    scale = size / min(w, h)
    rw, rh = max(1, round(w * scale)), max(1, round(h * scale))
    if (rw, rh) != (w, h):
        img = img.resize((rw, rh), Image.BILINEAR)
    left, top = (rw - size) // 2, (rh - size) // 2
    return np.asarray(img.crop((left, top, left + size, top + size)))
