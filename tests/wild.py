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


def _tiny_rotated(path: Path, size: Tuple[int, int], orientation: int) -> Path:
    """A JPEG of a few pixels with an EXIF orientation: turned, some of its axes have length 1."""
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    return _save(path, Image.fromarray(_pixels(*size, seed=orientation)), "JPEG", exif=exif, quality=95)


def _corrupt_exif(path: Path) -> Path:
    """A JPEG whose EXIF names a tag's data past its end: Pillow warns "Corrupt EXIF data"."""
    tiff = b"II*\x00" + struct.pack("<IH", 8, 1) + struct.pack("<HHII", 0x010E, 2, 4000, 26) + b"\x00" * 4
    buf = io.BytesIO()
    Image.fromarray(_pixels(30, 20, seed=40)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    app1 = b"Exif\x00\x00" + tiff
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + data[2:])
    return path


def _with_icc(path: Path) -> Path:
    """A JPEG carrying an ICC profile (a made-up sRGB one): decoded as stored, the profile ignored."""
    from PIL import ImageCms
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    return _save(path, Image.fromarray(_pixels(48, 32, seed=41)), "JPEG", icc_profile=icc, quality=90)


def _extraneous(path: Path) -> Path:
    """A JPEG with stray bytes before its end marker: libjpeg warns "Corrupt JPEG data: 3 extraneous
    bytes", simplejpeg refuses it, Pillow decodes it."""
    buf = io.BytesIO()
    Image.fromarray(_pixels(64, 48, seed=42)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[:-2] + b"\x00\x01\x02" + data[-2:])
    return path


def _banner() -> np.ndarray:
    """An 88x31 web banner: flat colours and sharp strokes, where the fast IDCT and plain chroma
    upsampling show once the image is enlarged (30 dB from the exact path before issue 44)."""
    a = np.zeros((31, 88, 3), np.uint8)
    a[:] = (30, 60, 160)
    a[:, 44:] = (220, 200, 40)
    a[8:23, 5:83:3] = (255, 255, 255)
    a[12:19, ::5] = (200, 20, 20)
    return a


def _cut_with_end_marker(path: Path) -> Path:
    """A JPEG cut short inside its scan, its end marker put back (a download repaired by hand): libjpeg
    warns "Corrupt JPEG data: premature end of data segment" and fills the rest, as Pillow does."""
    buf = io.BytesIO()
    Image.fromarray(_pixels(320, 256, seed=44)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) * 2 // 3] + b"\xff\xd9")
    return path


TINY = [((w, h), k) for (w, h) in ((2, 1), (1, 3), (4, 3)) for k in range(2, 9)]  # (W, H), orientation


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
    for (w, h), k in TINY:
        _tiny_rotated(jpg / "tiny" / f"{w}x{h}-orientation-{k}.jpg", (w, h), k)
    _save(jpg / "banner 88x31.jpg", Image.fromarray(_banner()), "JPEG", quality=75)
    _corrupt_exif(jpg / "corrupt-exif.jpg")
    _with_icc(jpg / "icc.jpg")
    _extraneous(jpg / "extraneous-bytes.jpg")
    _cut_with_end_marker(jpg / "cut-with-end-marker.jpg")
    return root


# ---- bad input: writer(path) and a fragment of the expected message --------

def _truncated(fmt: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        buf = io.BytesIO()
        Image.fromarray(_pixels(160, 120, seed=30)).save(buf, fmt)
        path.write_bytes(buf.getvalue()[: len(buf.getvalue()) * 2 // 3])
    return write


def jpeg_12bit(path: Path) -> None:
    """A JPEG whose frame header gives 12-bit samples: its header parses (simplejpeg's, libjpeg's), no
    8-bit decoder reads it."""
    buf = io.BytesIO()
    Image.fromarray(_pixels(48, 32, seed=31)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    sof = data.index(b"\xff\xc0")
    path.write_bytes(data[:sof + 4] + bytes([12]) + data[sof + 5:])


def many_scans(path: Path, scans: int = 400) -> None:
    """A progressive JPEG whose last scan is repeated until it has ``scans`` start-of-scan markers (each
    one more pass over every block when decoded)."""
    buf = io.BytesIO()
    Image.fromarray(_pixels(48, 32, seed=32)).save(buf, "JPEG", quality=90, progressive=True)
    data = buf.getvalue()
    last = data.rindex(b"\xff\xda")
    have = data.count(b"\xff\xda")
    path.write_bytes(data[:-2] + data[last:-2] * (scans - have) + data[-2:])


def _png_bad_crc(path: Path) -> None:
    """A PNG whose IDAT checksum is wrong (its pixels intact): only a CRC check sees it."""
    raw = b"".join(b"\x00" + bytes(range(i, i + 30)) for i in range(10))
    data = bytearray(_png(10, 10, 8, 2, raw))
    end = data.index(b"IEND") - 4  # the IDAT's CRC is the 4 bytes before IEND's length
    data[end - 4:end] = bytes(b ^ 0xFF for b in data[end - 4:end])
    path.write_bytes(bytes(data))


def _png_truncated_idat(path: Path) -> None:
    """A PNG whose IDAT chunk holds fewer bytes than its length says, IEND straight after."""
    raw = b"".join(b"\x00" + bytes(range(i, i + 30)) for i in range(10))
    data = _png(10, 10, 8, 2, raw)
    idat = data.index(b"IDAT") - 4
    n = struct.unpack(">I", data[idat:idat + 4])[0]
    path.write_bytes(data[:idat + 8 + n // 2] + data[idat + 8 + n + 4:])


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
    "12-bit-jpeg": (jpeg_12bit, "12-bit JPEG"),
    "many-scans-jpeg": (many_scans, "400 scans"),
    "png-bad-idat-crc": (_png_bad_crc, "damaged PNG"),
    "png-truncated-idat": (_png_truncated_idat, "PNG"),
}


def write_bad(root: Path, case: str) -> Path:
    """Write bad case ``case`` as ``root/bad/<case>.jpg`` (or .png); return its path."""
    ext = "png" if "png" in case or case == "bomb" else "jpg"
    path = root / "bad" / f"{case}.{ext}"
    path.parent.mkdir(parents=True, exist_ok=True)
    BAD[case][0](path)
    return path
