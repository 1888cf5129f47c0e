"""Images/s through each loading path, for a dataset of stored pixels read by whole batches.

    python benchmarks/loader_paths.py                  # 1,000 x 224 x 224 x 3 synthetic .npy memmap
    python benchmarks/loader_paths.py --dataset DIR    # a packed pixfeed dataset instead

Paths: a bare gathered copy out of the memory map (the floor every path pays),
make_loader's choice, the batch path without the read-ahead thread, the batch
path through 2 worker processes, and the habitual DataLoader (2 workers,
per-sample reads, default collate).  Ratios are against the bare copy measured
in the same run, so they hold across machines.  ``--step-ms`` adds a simulated
training step per batch (a sleep, which releases the GIL like a GPU wait
does): that is where the read-ahead thread pays off, hiding reads behind steps.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler

from pixfeed.loaders import make_loader
from pixfeed.loaders._testing import ArrayDataset


def synthetic(root: Path, count: int, side: int) -> ArrayDataset:
    path = root / "images.npy"
    images = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(count, side, side, 3))
    images[:] = np.random.default_rng(0).integers(0, 256, images.shape[1:], dtype=np.uint8)
    images.flush()
    return ArrayDataset(np.load(path, mmap_mode="r"))


def rate(batches: Callable[[], Iterable], epochs: int, step_s: float) -> float:
    """Images/s over ``epochs`` epochs, after one warm-up epoch."""
    sum(1 for _ in batches())
    start, images = time.perf_counter(), 0
    for _ in range(epochs):
        for batch in batches():
            images += len(batch[0])
            time.sleep(step_s)
    return images / (time.perf_counter() - start)


def bare_copies(dataset, batch_size: int) -> Callable[[], Iterable]:
    def run():
        order = torch.randperm(len(dataset)).tolist()
        return (dataset.get_batch(order[i:i + batch_size]) for i in range(0, len(order), batch_size))
    return run


def paths(dataset, batch_size: int) -> dict:
    auto = make_loader(dataset, batch_size)
    return {
        "bare gathered copy (floor)": bare_copies(dataset, batch_size),
        f"make_loader auto ({auto.pixfeed_plan.path}, {auto.num_workers} workers, "
        f"read_ahead={auto.pixfeed_plan.read_ahead})": lambda: auto,
        "batch path, in process, no thread": lambda: make_loader(dataset, batch_size, read_ahead=False),
        "batch path, 2 worker processes": lambda: make_loader(dataset, batch_size, num_workers=2),
        "habitual DataLoader, 2 workers": lambda: DataLoader(dataset, batch_size, sampler=RandomSampler(dataset),
                                                             num_workers=2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", help="a packed pixfeed dataset (stored pixels) instead of synthetic data")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated training step per batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.dataset:
            from pixfeed.datasets import open_dataset
            dataset = open_dataset(args.dataset)
        else:
            dataset = synthetic(Path(tmp), args.count, args.side)
        print(f"{len(dataset)} images of {dataset.fixed_shape}, batch {args.batch_size}, {args.epochs} epochs, "
              f"{args.step_ms} ms step")
        print(make_loader(dataset, args.batch_size).pixfeed_plan)
        floor = None
        for name, batches in paths(dataset, args.batch_size).items():
            images_per_s = rate(batches, args.epochs, args.step_ms / 1000)
            floor = floor or images_per_s
            print(f"{name:<60} {images_per_s:>9,.0f} images/s  {images_per_s / floor:5.2f} x floor")


if __name__ == "__main__":
    main()
