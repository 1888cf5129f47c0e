"""Source images as they come in the wild, written with Pillow and raw bytes.

``write_good(root)`` writes an ImageFolder tree of unusual but valid images
(every colour mode and EXIF orientation, odd sizes and names) that must pack
and read back exactly.  ``BAD`` maps each kind of bad input to a function
writing it and a fragment the error message must contain.
"""
from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path
from typing import Callable, Dict, Tuple

import numpy as np
import simplejpeg
from conftest import write_image
from PIL import Image

ORIENTATION = 0x0112


def _pixels(w: int, h: int, channels: int = 3, seed: int = 0, dtype=np.uint8) -> np.ndarray:
    """Smooth random pixels, so JPEG artifacts stay small and every image differs."""
    rng = np.random.default_rng(seed)
    top = np.iinfo(dtype).max
    y, x = np.mgrid[0:h, 0:w]
    ramp = (x * 7 + y * 5)[..., None] * (top // 255) + rng.integers(0, top // 2, channels)
    return np.clip(ramp + rng.normal(0, top / 40, (h, w, channels)), 0, top).astype(dtype)


def _save(path: Path, img: Image.Image, fmt: str, **opts) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format=fmt, **opts)
    return path


def png_bytes(arr: np.ndarray) -> bytes:
    """A PNG written byte by byte (for 16-bit RGB, which Pillow cannot save)."""
    h, w, c = arr.shape
    rows = arr.astype(f">u{arr.dtype.itemsize}").reshape(h, -1).view(np.uint8)
    raw = b"".join(b"\x00" + r.tobytes() for r in rows)
    return _png(w, h, arr.dtype.itemsize * 8, {1: 0, 2: 4, 3: 2, 4: 6}[c], raw)


def _png(w: int, h: int, depth: int, color_type: int, raw: bytes) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def _exif_jpeg(path: Path, orientation: int) -> Path:
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    return _save(path, Image.fromarray(_pixels(40, 24, seed=orientation)), "JPEG", exif=exif, quality=95)


def write_good(root: Path) -> Path:
    """The valid wild cases, in class folders with dots, spaces and nesting."""
    jpg, png, odd = root / "jpeg v1.0", root / "png.set", root / "odd names"
    write_image(jpg / "gray.jpg", mode="L", fmt="JPEG", seed=1)
    write_image(jpg / "cmyk.jpg", mode="CMYK", fmt="JPEG", seed=2)
    (jpg / "ycck.jpg").write_bytes(simplejpeg.encode_jpeg(_pixels(36, 28, 4, seed=3), colorspace="CMYK"))
    write_image(jpg / "progressive.jpg", fmt="JPEG", seed=4, progressive=True)
    for k in range(2, 9):
        _exif_jpeg(jpg / "exif" / f"orientation-{k}.jpg", k)
    _save(png / "gray16.png", Image.fromarray(_pixels(30, 20, 1, 5, np.uint16)[..., 0]), "PNG")
    (png / "rgb16.png").write_bytes(png_bytes(_pixels(26, 18, 3, 6, np.uint16)))
    (png / "rgba16.png").write_bytes(png_bytes(_pixels(22, 14, 4, 7, np.uint16)))
    write_image(png / "palette.png", mode="P", fmt="PNG", seed=8)
    pal = Image.fromarray(_pixels(20, 20, seed=9)).quantize(16)
    _save(png / "palette-transparent.png", pal, "PNG", transparency=3)
    _save(png / "rgba.png", Image.fromarray(_pixels(25, 15, 4, seed=10), "RGBA"), "PNG")
    _save(png / "gray-alpha.png", Image.fromarray(_pixels(15, 25, 2, seed=11), "LA"), "PNG")
    write_image(odd / "one.jpg", size=(1, 1), fmt="JPEG", seed=12)
    write_image(odd / "one.png", size=(1, 1), fmt="PNG", seed=13)
    write_image(odd / "wide.png", size=(1200, 3), fmt="PNG", seed=14)
    write_image(odd / "tall.jpg", size=(3, 900), fmt="JPEG", seed=15)
    write_image(odd / "UPPER.JPG", fmt="JPEG", seed=16)
    write_image(odd / "Upper.PNG", fmt="PNG", seed=17)
    write_image(odd / "café ñ 日本.jpeg", fmt="JPEG", seed=18)
    write_image(odd / "with space.png", fmt="PNG", seed=19)
    write_image(odd / "sub" / "deeper" / "nested.jpg", fmt="JPEG", seed=20)
    write_image(odd / "png named.jpg", fmt="PNG", seed=21)
    return root


# ---- bad input: writer(path) and a fragment of the expected message --------

def _truncated(fmt: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        buf = io.BytesIO()
        Image.fromarray(_pixels(160, 120, seed=30)).save(buf, fmt)
        path.write_bytes(buf.getvalue()[: len(buf.getvalue()) * 2 // 3])
    return write


def _bomb(path: Path) -> None:
    """A valid PNG header claiming 20000 x 20000 pixels, over twice Pillow's limit."""
    path.write_bytes(_png(20000, 20000, 1, 0, b""))


def _loop(path: Path) -> None:
    other = path.with_name("loop-b.jpg")
    os.symlink(other.name, path)
    os.symlink(path.name, other)


BAD: Dict[str, Tuple[Callable[[Path], None], str]] = {
    "zero-byte": (lambda p: p.write_bytes(b""), "empty file (0 bytes)"),
    "truncated-jpeg": (_truncated("JPEG"), "truncated"),
    "truncated-png": (_truncated("PNG"), "PNG"),
    "text-as-jpeg": (lambda p: p.write_text("hello, not an image\n"), "not a JPEG, PNG or WebP"),
    "bomb": (_bomb, "--max-pixels"),
    "broken-symlink": (lambda p: os.symlink("missing-target.jpg", p), "broken symbolic link"),
    "symlink-loop": (_loop, "symbolic link loop"),
}


def write_bad(root: Path, case: str) -> Path:
    """Write bad case ``case`` as ``root/bad/<case>.jpg`` (or .png); return its path."""
    ext = "png" if "png" in case or case == "bomb" else "jpg"
    path = root / "bad" / f"{case}.{ext}"
    path.parent.mkdir(parents=True, exist_ok=True)
    BAD[case][0](path)
    return path
