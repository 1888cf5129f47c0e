"""COCO-style annotations to a pixfeed dataset with ``pixfeed.pack_samples``: images, boxes, category ids and
masks rasterised from the polygons.

    python examples/coco_to_pixfeed.py --make-sample coco-sample          # a tiny synthetic COCO-style sample
    python examples/coco_to_pixfeed.py coco-sample/annotations.json coco-sample/images DST [--format wds]

Each image becomes one sample: ``image`` (its file), ``label`` (the category of its first annotation),
``boxes`` (float32 [N, 4] xyxy from COCO's [x, y, w, h]), ``box_classes`` (int64 [N], one per box, dropped
with the boxes a crop leaves empty) and ``mask`` (HxW uint8: each pixel the category id of the last polygon
covering it, 0 for background).  The images are read in parallel, one image per input of
``pack_samples(fn, DST, inputs=...)``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

import pixfeed

SCHEMA = {"boxes": "boxes", "box_classes": "int64[N]", "mask": "mask"}


class CocoSamples:
    """``fn(image_entry)`` for pack_samples: one COCO image and its annotations as a sample dict."""

    def __init__(self, annotations: dict, images: Path) -> None:
        self.images = images
        self.by_image: dict = {}
        for a in annotations["annotations"]:
            self.by_image.setdefault(a["image_id"], []).append(a)

    def __call__(self, entry: dict):
        anns = self.by_image.get(entry["id"], [])
        mask = Image.new("L", (entry["width"], entry["height"]), 0)
        draw = ImageDraw.Draw(mask)
        for a in anns:
            for polygon in a["segmentation"]:
                draw.polygon([tuple(p) for p in np.reshape(polygon, (-1, 2))], fill=a["category_id"])
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)], np.float32).reshape(-1, 4)
        yield {"image": self.images / entry["file_name"], "key": Path(entry["file_name"]).stem,
               "label": anns[0]["category_id"] if anns else 0, "boxes": boxes,
               "box_classes": np.array([a["category_id"] for a in anns], np.int64), "mask": np.asarray(mask)}


def convert(annotations: Path, images: Path, dst: Path, fmt: str = "mmap", **options) -> dict:
    coco = json.loads(annotations.read_text())
    return pixfeed.pack_samples(CocoSamples(coco, images), dst, fmt, inputs=coco["images"], schema=SCHEMA,
                                per_box="box_classes", **options)


def make_sample(root: Path, count: int = 8, seed: int = 0) -> Path:
    """``count`` images with 1-3 filled polygons each, drawn in colours of their category, and the COCO file."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    colours = {1: (220, 40, 40), 2: (40, 200, 40), 3: (40, 60, 220)}
    coco = {"images": [], "annotations": [], "categories": [{"id": c, "name": n} for c, n in
                                                             ((1, "red"), (2, "green"), (3, "blue"))]}
    for i in range(count):
        w, h = int(rng.integers(64, 129)), int(rng.integers(48, 97))
        img = Image.new("RGB", (w, h), (0, 0, 0))
        draw = ImageDraw.Draw(img)
        coco["images"].append({"id": i, "file_name": f"{i:06d}.png", "width": w, "height": h})
        for _ in range(int(rng.integers(1, 4))):
            c = int(rng.integers(1, 4))
            x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
            x1, y1 = int(rng.integers(x0 + 10, w)), int(rng.integers(y0 + 10, h))
            polygon = [x0, y0, x1, y0, x1, y1, x0, y1]
            draw.polygon([tuple(p) for p in np.reshape(polygon, (-1, 2))], fill=colours[c])
            coco["annotations"].append({"id": len(coco["annotations"]), "image_id": i, "category_id": c,
                                        "segmentation": [polygon], "bbox": [x0, y0, x1 - x0, y1 - y0]})
        img.save(root / "images" / f"{i:06d}.png")  # lossless: a pixel's colour says its category
    (root / "annotations.json").write_text(json.dumps(coco))
    return root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("annotations", nargs="?", type=Path)
    p.add_argument("images", nargs="?", type=Path)
    p.add_argument("dst", nargs="?", type=Path)
    p.add_argument("--format", default="mmap")
    p.add_argument("--make-sample", type=Path, metavar="DIR", help="write a tiny synthetic COCO-style sample there")
    args = p.parse_args()
    if args.make_sample:
        root = make_sample(args.make_sample)
        print(f"wrote {root}/annotations.json and {root}/images; convert it with:\n"
              f"  python {__file__} {root}/annotations.json {root}/images DST")
        return
    if not (args.annotations and args.images and args.dst):
        p.error("give ANNOTATIONS IMAGES DST, or --make-sample DIR")
    m = convert(args.annotations, args.images, args.dst, args.format, store="encoded")
    print(f"packed {m['count']} images with {', '.join(f['name'] for f in m['schema'])} into {args.dst}")


if __name__ == "__main__":
    main()
