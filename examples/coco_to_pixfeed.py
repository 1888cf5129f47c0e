"""COCO-style annotations to a pixfeed dataset with ``pixfeed.pack_samples``: images, boxes, category ids and
masks rasterised from the polygons and decoded from RLE (``iscrowd`` regions).

    python examples/coco_to_pixfeed.py --make-sample coco-sample          # a tiny synthetic COCO-style sample
    python examples/coco_to_pixfeed.py coco-sample/annotations.json coco-sample/images DST [--format wds]

Each image becomes one sample: ``image`` (its file), ``label`` (the category of its first annotation, -1
(unlabelled) for an image without any),
``boxes`` (float32 [N, 4] xyxy from COCO's [x, y, w, h]), ``box_classes`` (int64 [N], one per box, dropped
with the boxes a crop leaves empty) and ``mask`` (HxW uint8: each pixel the category id of the last
annotation covering it, 0 for background).  An annotation's segmentation is a list of polygons, or run-length
encoded as pycocotools' ``annToMask`` reads it: ``{"counts": [...], "size": [h, w]}`` (uncompressed, the
``iscrowd`` form) or ``{"counts": "<COCO's compressed string>", "size": [h, w]}``, decoded here in NumPy
(column-major, as COCO stores masks; ``rle_decode``) so pycocotools is not needed.  The classes are named from
the file's ``categories`` (``class_names=``: label i is category id i, as in the masks and ``box_classes``;
id 0, the masks' background, is named "background" unless a category has it; other ids no category uses
keep their number as name).  The images are read in parallel, one image per input of ``pack_samples(fn, DST, inputs=...)``.
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
        height, width = entry["height"], entry["width"]
        mask = Image.new("L", (width, height), 0)
        draw = ImageDraw.Draw(mask)
        for a in anns:
            segmentation = a["segmentation"]
            if isinstance(segmentation, dict):  # RLE: paint what the polygons painted so far, then the region
                region = rle_decode(segmentation, (height, width), f"annotation {a.get('id')}")
                pixels = np.array(mask)
                pixels[region.astype(bool)] = a["category_id"]
                mask = Image.fromarray(pixels)
                draw = ImageDraw.Draw(mask)
                continue
            for polygon in segmentation:
                draw.polygon([tuple(p) for p in np.reshape(polygon, (-1, 2))], fill=a["category_id"])
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)], np.float32).reshape(-1, 4)
        yield {"image": self.images / entry["file_name"], "key": Path(entry["file_name"]).stem,
               "label": anns[0]["category_id"] if anns else -1, "boxes": boxes,
               "box_classes": np.array([a["category_id"] for a in anns], np.int64), "mask": np.asarray(mask)}


def rle_counts(counts) -> np.ndarray:
    """The run lengths of a COCO RLE: a list of ints as given, or COCO's compressed string (pycocotools'
    ``rleFrString``: 5 bits a character from 48, a continuation bit 0x20, the last character's 0x10 its
    sign; from the third run on, each is a difference from the run two before)."""
    if not isinstance(counts, (str, bytes)):
        return np.asarray(counts, np.int64)
    text = counts.encode("ascii") if isinstance(counts, str) else counts
    out, p = [], 0
    while p < len(text):
        x, k, more = 0, 0, True
        while more:
            if p >= len(text):
                raise ValueError("the compressed counts end inside a number")
            c = text[p] - 48
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p, k = p + 1, k + 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        if len(out) > 2:
            x += out[-2]
        out.append(x)
    return np.asarray(out, np.int64)


def rle_decode(rle: dict, shape: tuple, where: str = "an RLE") -> np.ndarray:
    """A COCO RLE ``{"counts": ..., "size": [h, w]}`` as an h x w uint8 mask of 0 and 1, as pycocotools'
    ``annToMask`` gives it: runs alternate 0s and 1s (0s first), down each column in turn (column-major)."""
    h, w = (int(v) for v in rle["size"])
    if (h, w) != tuple(shape):
        raise ValueError(f"{where}: its RLE size is {[h, w]} but its image is {list(shape)} (height, width)")
    counts = rle_counts(rle["counts"])
    if (counts < 0).any() or counts.sum() != h * w:
        raise ValueError(f"{where}: its RLE counts cover {int(counts.sum())} pixels (some negative: "
                         f"{bool((counts < 0).any())}), not the {h} x {w} = {h * w} of its size")
    values = np.arange(len(counts)) % 2
    return np.repeat(values.astype(np.uint8), counts).reshape(w, h).T.copy()


def class_names(categories: list) -> list:
    """Names for labels 0..max id: each category's name at its id; 0, the masks' background, "background"
    when no category has that id; another id without a category keeps its number (as pack_samples names
    integer labels); where a category is named so already, "unused <id>"."""
    names = {int(c["id"]): str(c["name"]) for c in categories}
    if not names:
        return []
    out = []
    for i in range(max(names) + 1):
        name = names.get(i, "background" if i == 0 else str(i))
        out.append(name if i in names or name not in names.values() else f"unused {i}")
    return out


def convert(annotations: Path, images: Path, dst: Path, fmt: str = "mmap", **options) -> dict:
    coco = json.loads(annotations.read_text())
    named = {"class_names": class_names(coco["categories"])} if coco.get("categories") else {}
    return pixfeed.pack_samples(CocoSamples(coco, images), dst, fmt, inputs=coco["images"], schema=SCHEMA,
                                per_box="box_classes", **named, **options)


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
