"""Fields: packing from an index file vs the folder, and reading image + caption vs image + label.

    python benchmarks/bench_fields.py [SRC] [--reps 3]

SRC is an ImageFolder (default: a synthetic sample of --count images); an
index.csv of the same images (path, label, a caption), with paths into SRC, is
written in a temporary folder.  Every figure is a ratio of two things
measured in this run, alternating repetitions, best of --reps:

* pack rate from the index / from the folder (same images, format, store),
* make_loader rate reading (image, caption) / reading (image, label),
* a caption-only read of an encoded dataset / reading its images.
"""
from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
import time
from pathlib import Path

import pixfeed
from pixfeed.sources.folder import scan


def write_index(src: Path, out: Path) -> Path:
    source = scan(src)
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "caption"])
        for p, label in zip(source.paths, source.labels):
            cls = source.classes[label] if source.classes else "thing"
            w.writerow([p, cls, f"a photo of a {cls.replace('_', ' ')}, file {p}"])
    return out


def pack_rate(src, dst, fmt, store, **kw) -> float:
    m = pixfeed.pack(src, dst, fmt, store=store, overwrite=True, **kw)
    return m["count"] / m["stats"]["seconds"]


def read_rate(path, epochs: int = 2, **kw) -> float:
    ds = pixfeed.open_dataset(path, **kw)
    loader = pixfeed.make_loader(ds, 64, shuffle=True)
    best = 0.0
    for _ in range(epochs):
        start, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch[0])
        best = max(best, n / (time.perf_counter() - start))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", nargs="?", type=Path)
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pixfeed-bench-fields-"))
    try:
        src = args.src or pixfeed_sample(work / "sample", args.count)
        index = write_index(src, work / "index.csv")
        rows = []
        for fmt, store in (("mmap", "pixels"), ("wds", "encoded")):
            folder, indexed = [], []
            for _ in range(args.reps):
                folder.append(pack_rate(src, work / "folder", fmt, store))
                indexed.append(pack_rate(src, work / "index", fmt, store, index=str(index)))
            rows.append((f"pack {fmt}/{store}: index / folder", max(indexed), max(folder)))
        for store, size in (("pixels", 224), ("encoded", 224)):
            pixfeed.pack(src, work / "ds", "mmap", store=store, index=str(index), overwrite=True)
            labels, captions = [], []
            for _ in range(args.reps):
                labels.append(read_rate(work / "ds", size=size))
                captions.append(read_rate(work / "ds", size=size, fields=("image", "caption")))
            rows.append((f"read mmap/{store}: (image, caption) / (image, label)", max(captions), max(labels)))
        images = [read_rate(work / "ds", size=224) for _ in range(args.reps)]
        only = [read_rate(work / "ds", fields=("caption",)) for _ in range(args.reps)]
        rows.append(("read mmap/encoded: caption only / image", max(only), max(images)))
        print(f"{'ratio':<56} {'value':>7}   (a / b, images/s)")
        for name, a, b in rows:
            print(f"{name:<56} {a / b:>7.2f}   ({a:,.0f} / {b:,.0f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def pixfeed_sample(root: Path, count: int) -> Path:
    from pixfeed.sample import make_sample

    return make_sample(root, count)


if __name__ == "__main__":
    main()
