"""A synthetic, photo-like ImageFolder sample, so the demo and benchmark need no data.

Images are smooth colour gradients with blurred shapes and noise (so JPEG
sizes and decode times resemble photos), in several sizes and aspect ratios;
about one in eight is grayscale, one in eight an RGBA PNG, a quarter PNG.
Formats and colour modes are spread evenly over the classes (image ``i`` of a
class gets kind ``i % 8``), so neither says which class an image is: a model
trained on the sample cannot learn the class from the file type.

``claim_folder`` and ``mark_folder`` keep ``pixfeed sample`` from writing into
a folder of someone else's files: a sample lists the files it wrote in
``DIR/.pixfeed-sample``; a missing or empty DIR is written into, a DIR holding
such a sample is replaced only with ``overwrite`` (its listed files removed,
nothing else), and any other DIR is refused.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from .errors import OptionError

CLASSES = ("bird", "boat", "cat", "dog", "flower", "fruit", "house", "tree")
MARK = ".pixfeed-sample"  # the files a sample wrote, one relative path a line after a JSON heading
SIZES = ((375, 500), (500, 375), (333, 500), (480, 640), (256, 256), (600, 400))


def _image(rng: np.random.Generator, h: int, w: int, noise: np.ndarray) -> Image.Image:
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(0, 255, 3).astype(np.float32)
    slope = rng.uniform(-0.4, 0.4, (2, 3)).astype(np.float32)
    arr = base + x[..., None] * slope[0] + y[..., None] * slope[1]
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 12))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        r = int(rng.integers(10, max(11, min(h, w) // 3)))
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0 - r, y0 - r, x0 + r, y0 + r), fill=fill)
    img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 2.5))))
    top, left = int(rng.integers(noise.shape[0] - h + 1)), int(rng.integers(noise.shape[1] - w + 1))
    grain = noise[top:top + h, left:left + w]  # a window of one noise field: drawing per image cost a fifth
    return Image.fromarray(np.clip(np.asarray(img) + grain, 0, 255).astype(np.uint8), "RGB")


def make_sample(root, count: int = 200, seed: int = 0) -> Path:
    """Write ``count`` images into ``root/<class>/img_NNNNN.{jpg,png}``; return root."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    side = max(max(s) for s in SIZES)
    noise = (rng.standard_normal((side, side, 3), dtype=np.float32) * 6).astype(np.int16)
    for i in range(count):
        cls = CLASSES[i % len(CLASSES)]
        h, w = SIZES[int(rng.integers(len(SIZES)))]
        img = _image(rng, h, w, noise)
        kind = (i // len(CLASSES)) % 8  # the class's own count: every kind in every class
        (root / cls).mkdir(parents=True, exist_ok=True)
        if kind == 1:
            img.convert("L").save(root / cls / f"img_{i:05d}.jpg", quality=90)
        elif kind == 2:
            rgba = img.convert("RGBA")
            rgba.putalpha(Image.linear_gradient("L").resize(img.size))
            rgba.save(root / cls / f"img_{i:05d}.png")
        elif kind == 3:
            img.save(root / cls / f"img_{i:05d}.png")
        else:
            img.save(root / cls / f"img_{i:05d}.jpg", quality=int(rng.integers(80, 96)))
    return root


def _files(root: Path) -> list:
    """Every file under ``root`` but the mark, as relative paths; a symbolic link is an entry of its own,
    never followed (what ``--overwrite`` removes is found here, never taken from the mark's text)."""
    out = []
    for folder, dirs, names in os.walk(root):  # links to folders are listed in dirs, not entered
        here = Path(folder).relative_to(root)
        out += [str(here / n) for n in names if not (n == MARK and here == Path("."))]
        out += [str(here / d) for d in dirs if os.path.islink(os.path.join(folder, d))]
    return sorted(out)


def claim_folder(root, overwrite: bool = False, option: str = "DIR") -> Path:
    """Make ``root`` ready for a sample (see the module docstring); an OptionError names what stands in the way."""
    root = Path(root)
    if not root.exists() or not any(root.iterdir()):
        return root
    mark = root / MARK
    if not mark.is_file():
        first = next(iter(_files(root)), None) or next(iter(root.iterdir())).name
        raise OptionError(f"{option} {root}: not empty (it holds {first}) and not a sample pixfeed wrote; "
                          "pixfeed sample writes into a missing or empty folder: name another")
    if not overwrite:
        raise OptionError(f"{option} {root}: holds a sample pixfeed wrote; pass --overwrite to replace it")
    from .storage.bounded import MANIFEST_BYTES, read_file

    listed = set(read_file(mark, MANIFEST_BYTES, mark, "sample list").decode("utf-8", "replace").splitlines()[1:])
    foreign = [f for f in _files(root) if f not in listed]
    if foreign:
        raise OptionError(f"{option} {root}: holds {foreign[0]}, which pixfeed sample did not write; "
                          "--overwrite removes only a sample's own files: move it out or name another folder")
    for rel in _files(root):  # each listed (no foreign file): files found in root, not paths the mark names
        (root / rel).unlink(missing_ok=True)
    mark.unlink()
    for folder, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
        if Path(folder) != root and not os.listdir(folder):
            os.rmdir(folder)  # only folders the removed files leave empty
    return root


def mark_folder(root, what: str) -> None:
    """List every file now under ``root`` as the sample's own (written after ``claim_folder`` emptied it)."""
    root = Path(root)
    heading = json.dumps({"written_by": "pixfeed sample", "what": what})
    (root / MARK).write_text("\n".join([heading, *_files(root)]) + "\n", encoding="utf-8")
