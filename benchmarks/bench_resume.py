"""Cost of resuming mid-epoch: load_state_dict + first batch, against a fresh epoch's first batch.

    python benchmarks/bench_resume.py                 # 10,000 small JPEGs packed as mmap (encoded)
    python benchmarks/bench_resume.py --count 2000 --workers 0

A loader reads half an epoch and saves its state; a new loader loads it and
times its first batch.  Resuming moves the sampler's start and seeds crops per
sample, so nothing of the consumed half is read or decoded again: the ratio to a
fresh epoch's first batch (made the same way, measured in the same run,
alternating, median of ``--reps``) should be about 1.  Replaying the consumed
half through decode, as a loader without a resumable sampler must, is timed
too for contrast.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from pixfeed.datasets import open_dataset
from pixfeed.loaders import make_loader
from pixfeed.packers import pack


def source(root: Path, count: int) -> Path:
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"c{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(folder / f"{i:05d}.jpg")
    return root


def first_batch(make, state=None) -> float:
    start = time.perf_counter()
    loader = make()
    if state is not None:
        loader.load_state_dict(state)
    next(iter(loader))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pack(source(root / "src", args.count), root / "data", "mmap", store="encoded")
        dataset = open_dataset(root / "data", size=32, crop="random")
        make = lambda: make_loader(dataset, args.batch_size, num_workers=args.workers, seed=1)  # noqa: E731
        loader, half = make(), len(make()) // 2
        start = time.perf_counter()
        for n, _ in enumerate(loader, 1):
            if n == half:
                break
        replay = time.perf_counter() - start
        state = loader.state_dict()
        fresh, resumed = [], []
        for _ in range(args.reps):
            fresh.append(first_batch(make))
            resumed.append(first_batch(make, state))
    f, r = statistics.median(fresh), statistics.median(resumed)
    print(f"{args.count} records, batch {args.batch_size}, {args.workers} workers, resumed after {half} batches")
    print(f"fresh epoch, first batch:            {f * 1e3:8.1f} ms")
    print(f"load_state_dict + first batch:       {r * 1e3:8.1f} ms  ({r / f:.2f}x fresh)")
    print(f"replaying the consumed {half} batches: {replay * 1e3:8.1f} ms  ({replay / f:.1f}x fresh)")


if __name__ == "__main__":
    main()
