"""A small source with typed fields, written as an image folder plus CSV, JSONL and Parquet indexes.

Images are PNGs of solid blocks (lossless, so pixels can be compared), each
with a mask whose labels are its blocks and boxes around them.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = np.array([[200, 30, 30], [30, 200, 30], [30, 30, 200], [220, 220, 40]], np.uint8)
FIELDS = ["--field", "boxes:boxes", "--field", "box_cls:int64[N]", "--field", "mask:mask", "--per-box", "box_cls"]


def scene(i: int):
    """(image HxWx3, mask HxW, boxes [[x0, y0, x1, y1]], box classes) of sample ``i``."""
    h, w = (48, 64) if i % 2 else (64, 48)
    mask = np.zeros((h, w), np.uint8)
    boxes, classes = [], []
    for k in range(1 + i % 3):
        x0, y0 = 4 + 9 * k, 5 + 7 * k + i % 4
        x1, y1 = x0 + 14 + 2 * i, y0 + 12 + i
        mask[y0:y1, x0:x1] = k + 1
        boxes.append([x0, y0, min(x1, w), min(y1, h)])
        classes.append(k)
    image = np.where(mask[..., None] > 0, COLOURS[np.maximum(mask, 1) - 1], np.array([90, 90, 90], np.uint8))
    return image.astype(np.uint8), mask, boxes, classes


def rows(n: int):
    for i in range(n):
        _, _, boxes, classes = scene(i)
        yield {"image": f"img/{i:02d}.png", "label": ["cat", "dog"][i % 2], "caption": f"caption {i} é",
               "score": i * 0.5 + 0.25, "count": i - 2, "meta": {"i": i, "names": ["x"] * (i % 3)},
               "tags": list(range(i % 3)), "emb": [i + 0.5, i + 1.5, i + 2.5], "mask": f"masks/{i:02d}.png",
               "boxes": boxes, "box_cls": classes}


def make_field_tree(root: Path, n: int = 6) -> Path:
    """Write the images, masks and ``index.csv``, ``index.jsonl``, ``paths.parquet``, ``hf.parquet``."""
    (root / "img").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(n):
        image, mask, _, _ = scene(i)
        Image.fromarray(image).save(root / f"img/{i:02d}.png")
        Image.fromarray(mask, "L").save(root / f"masks/{i:02d}.png")
    table = list(rows(n))
    with open(root / "index.csv", "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(table[0])
        for r in table:
            out.writerow([json.dumps(v) if isinstance(v, (list, dict)) else v for v in r.values()])
    (root / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in table), encoding="utf-8")
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {k: [r[k] for r in table] for k in table[0]}
    pq.write_table(pa.table(columns), root / "paths.parquet")
    columns["image"] = [{"bytes": (root / p).read_bytes(), "path": p} for p in columns["image"]]
    pq.write_table(pa.table(columns), root / "hf.parquet")
    return root
