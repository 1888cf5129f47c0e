"""A synthetic sample with an index file: captions, multi-labels, boxes and a mask per image.

``pixfeed sample DIR --index`` writes ``DIR/images/NNNNN.{jpg,png}``,
``DIR/masks/NNNNN.png`` and ``DIR/index.csv`` with the columns

    image        the image's path relative to DIR
    label        the scene's class name (--class-column label)
    caption      a sentence naming the objects (str)
    tags         the object categories present, a JSON list (inferred int64[N])
    boxes        JSON [[x0, y0, x1, y1], ...] of the objects (--field boxes:boxes)
    box_classes  the category of each box, a JSON list (--field box_classes:int64[N], --per-box)
    mask         the mask's path: each object's pixels hold its category + 1 (--field mask:mask)

Objects are filled rectangles of one colour per category drawn on a smooth
background, so a mask, box or caption can be checked against the pixels.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CATEGORIES = ("red square", "green block", "blue tile", "yellow card")
COLOURS = ((220, 40, 40), (40, 200, 60), (50, 70, 230), (240, 220, 40))
SCENES = ("indoor", "outdoor", "studio")
SIZES = ((240, 320), (320, 240), (256, 256), (200, 300))
COMMAND = ("pixfeed pack --index {dir}/index.csv --class-column label --field boxes:boxes "
           "--field box_classes:int64[N] --per-box box_classes --field mask:mask {dir} DST")


def _scene(rng: np.random.Generator, h: int, w: int):
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(90, 160) + 0.08 * x + 0.05 * y
    img = Image.fromarray(np.clip(np.stack([base, base * 0.9, base * 0.8], -1), 0, 255).astype(np.uint8))
    mask = Image.new("L", (w, h))
    boxes, classes = [], []
    for _ in range(int(rng.integers(1, 4))):
        c = int(rng.integers(len(CATEGORIES)))
        bw, bh = int(rng.integers(w // 6, w // 2)), int(rng.integers(h // 6, h // 2))
        x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
        ImageDraw.Draw(img).rectangle((x0, y0, x0 + bw - 1, y0 + bh - 1), fill=COLOURS[c])
        ImageDraw.Draw(mask).rectangle((x0, y0, x0 + bw - 1, y0 + bh - 1), fill=c + 1)
        boxes.append([x0, y0, x0 + bw, y0 + bh])
        classes.append(c)
    return img, mask, boxes, classes


def make_index_sample(root, count: int = 200, seed: int = 0) -> Path:
    """Write ``count`` images, their masks and ``index.csv`` under ``root``; return the index's path."""
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(exist_ok=True)
    rng = np.random.default_rng(seed)
    with open(root / "index.csv", "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["image", "label", "caption", "tags", "boxes", "box_classes", "mask"])
        for i in range(count):
            h, w = SIZES[int(rng.integers(len(SIZES)))]
            img, mask, boxes, classes = _scene(rng, h, w)
            name = f"images/{i:05d}.{'png' if i % 4 == 3 else 'jpg'}"
            img.save(root / name, quality=92) if name.endswith("jpg") else img.save(root / name)
            mask.save(root / f"masks/{i:05d}.png")
            names = [CATEGORIES[c] for c in classes]
            out.writerow([name, SCENES[i % len(SCENES)], f"a photo with {', '.join(names)}",
                          json.dumps(sorted(set(classes))), json.dumps(boxes), json.dumps(classes),
                          f"masks/{i:05d}.png"])
    return root / "index.csv"
