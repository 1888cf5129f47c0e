"""Decode + resize + center crop of in-memory JPEGs on one core, as ratios to the usual Pillow pipeline.

    python benchmarks/bench_decode.py IMAGES [--size 224] [--reps 5]

Each candidate runs through all the images in a row (warm caches, as in a
loader worker); candidates take turns ``--reps`` times, so machine load hits
all alike; each (image, candidate) keeps its fastest time.
Rows: images/s and the ratio to ``usual`` (Pillow decode + Resize(256) +
CenterCrop(224), torchvision's evaluation pipeline), then PSNR against
pixfeed's exact path (the same Resize(256) + CenterCrop(224)), which is what the fast
path must stay close to.  A second table re-encodes the images with
``--max-side`` values (JPEG quality 90) and reports size, fast-decode speed and
PSNR against the exact decode of the original.
"""
from __future__ import annotations

import argparse
import io
import math
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import torch
from PIL import Image

from pixfeed.image import jpeghead as _jpeghead
from pixfeed.image.fast import resize_uint8
from pixfeed.image.decode import decode
from pixfeed.sources.folder import scan


def usual(data: bytes, s: int = 224) -> np.ndarray:
    """torchvision: PIL loader, Resize(256) (bilinear, antialias), CenterCrop(224), PILToTensor."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    short = round(s * 256 / 224)
    rw, rh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    img = img.resize((rw, rh), Image.BILINEAR)
    left, top = round((rw - s) / 2), round((rh - s) / 2)
    return np.asarray(img.crop((left, top, left + s, top + s)))


def without_simplejpeg(fn: Callable) -> Callable:
    def run(data: bytes):
        saved, _jpeghead.simplejpeg = _jpeghead.simplejpeg, None
        try:
            return fn(data)
        finally:
            _jpeghead.simplejpeg = saved
    return run


def resize_candidates(size: int) -> Dict[str, Callable]:
    """The resize alone, on decoded arrays: Pillow, Pillow reduce+resize, torch uint8 antialias."""
    def geometry(a):
        h, w = a.shape[:2]
        scale = size / min(h, w)
        return max(size, round(w * scale)), max(size, round(h * scale))

    def pillow(a, gap=None):
        return np.asarray(Image.fromarray(a).resize(geometry(a), Image.BILINEAR, reducing_gap=gap))

    def torch_aa(a):
        rw, rh = geometry(a)
        return resize_uint8(a, (rw, rh), (rh / a.shape[0], rw / a.shape[1]))
    return {"resize pillow": pillow, "resize pillow reduce+resize": lambda a: pillow(a, 2.0),
            "resize torch uint8 aa": torch_aa}


def interleaved(cands: Dict[str, Callable], inputs: Dict[str, List], reps: int) -> Dict[str, float]:
    """Seconds per image for each candidate: mean over images of the fastest of ``reps`` runs.

    Each candidate runs through every image in a row, as in a loader worker, and
    the candidates take turns ``reps`` times, so load on the machine hits all
    alike.  (Turns of one image each, with the Pillow candidates in between,
    slowed the fast path by 10% here: its caches were never warm.)"""
    n = len(next(iter(inputs.values())))
    best = {k: np.full(n, np.inf) for k in cands}
    for _ in range(reps):
        for k, fn in cands.items():
            for j, item in enumerate(inputs[k]):
                t = time.perf_counter()
                fn(item)
                best[k][j] = min(best[k][j], time.perf_counter() - t)
    return {k: float(v.mean()) for k, v in best.items()}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return 99.0 if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def reencode(data: bytes, side: int) -> bytes:
    img = Image.fromarray(decode(data))
    scale = side / max(img.size)
    if scale < 1:
        img = img.resize((max(1, round(img.size[0] * scale)), max(1, round(img.size[1] * scale))), Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--limit", type=int, default=500)
    args = ap.parse_args()
    torch.set_num_threads(1)
    source = scan(args.src)
    blobs = [(source.root / p).read_bytes() for p in source.paths[: args.limit]]
    s = (args.size, args.size)
    fast = lambda d: decode(d, size=s)  # noqa: E731
    cands = {"usual": lambda d: usual(d, args.size), "pixfeed exact": lambda d: decode(d, size=s, exact=True),
             "pixfeed fast": fast, "pixfeed fast, no simplejpeg": without_simplejpeg(fast)}
    arrays = [np.array(decode(d)) for d in blobs]
    resizers = resize_candidates(args.size)
    times = interleaved({**cands, **resizers}, {**{k: blobs for k in cands}, **{k: arrays for k in resizers}},
                        args.reps)
    exact = [decode(d, size=s, exact=True) for d in blobs]
    print(f"{len(blobs)} JPEGs from {args.src}, one thread, best of {args.reps} interleaved runs, size {args.size}")
    print(f"{'candidate':32s} {'img/s':>8s} {'x usual':>8s} {'PSNR min/p1/median vs exact':>28s}")
    for k, fn in cands.items():
        p = np.array([psnr(fn(d), e) for d, e in zip(blobs, exact)]) if k != "usual" else None
        q = "" if p is None else f"{p.min():.1f} / {np.percentile(p, 1):.1f} / {np.median(p):.1f}"
        print(f"{k:32s} {1 / times[k]:8.0f} {times['usual'] / times[k]:8.2f} {q:>28s}")
    for k in resizers:
        print(f"{k:32s} {1 / times[k]:8.0f} {'(resize of decoded arrays only)':>37s}")
    max_side_table(blobs, s, args.reps, exact)


def max_side_table(blobs: List[bytes], s, reps: int, exact: List[np.ndarray]) -> None:
    sides = [None, 384, 320, 256]
    sets = {side: blobs if side is None else [reencode(d, side) for d in blobs] for side in sides}
    fast = lambda d: decode(d, size=s)  # noqa: E731
    times = interleaved({str(k): fast for k in sides}, {str(k): v for k, v in sets.items()}, reps)
    print(f"\n--max-side (re-encoded at quality 90; PSNR of the fast {s[0]} crop vs the original's exact one)")
    for side, data in sets.items():
        p = np.median([psnr(fast(d), e) for d, e in zip(data, exact)])
        print(f"  {str(side or 'original'):9s} {sum(map(len, data)) / 2**20:7.1f} MiB "
              f"{times[str(None)] / times[str(side)]:6.2f}x read speed  median PSNR {p:.1f} dB")


if __name__ == "__main__":
    main()
