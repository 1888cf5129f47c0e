"""Stored pixels, warm: make_loader against the dataset's own loop, a naive memmap loop and a memory copy.

    python benchmarks/loader_paths.py                   # packs a synthetic sample of --count images at 224
    python benchmarks/loader_paths.py --src DIR         # packs these images instead (pixels, 224)
    python benchmarks/loader_paths.py --dataset DIR     # an existing packed dataset of stored pixels

References, all in the training process, batch 64, one epoch each, shuffled:
one thread's memory copy (``bench.ceilings.memcopy``, as images/s of this
shape), the naive loop over ``np.load(mmap_mode="r")`` batch slices (sorted
indices; no checksums, as the peer kit's ``memmap_batch_slice_nw0``), and the
dataset's own ``get_batch`` loop with and without checksums.  Loaders:
``make_loader`` as a user calls it (with and without checksums), with
``read_ahead=True``, through 2 worker processes, with
``memory_format=torch.contiguous_format`` (NCHW strides: the transposing copy
that channels_last batches avoid), and the habitual DataLoader
(2 workers, per-sample reads, default collate).  Rows are measured in rounds,
each row once per round, and each keeps its best epoch, so a burst of load
elsewhere on the machine costs every row alike.  The goals (issue 25) are
printed as ratios of rows measured in the same run, with the load average.
``--step-ms`` adds a simulated training step per batch (a sleep, which
releases the GIL like a GPU wait does): that is where ``read_ahead`` pays.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader, RandomSampler

from pixfeed.bench.ceilings import memcopy
from pixfeed.datasets import open_dataset
from pixfeed.loaders import make_loader
from pixfeed.packers import pack
from pixfeed.sample import make_sample

Epoch = Callable[[], Iterable]


def epoch_rate(batches: Epoch, step_s: float) -> float:
    """Images/s of one epoch."""
    start, images = time.perf_counter(), 0
    for batch in batches():
        images += len(batch[1])
        time.sleep(step_s)
    return images / (time.perf_counter() - start)


def get_batch_loop(dataset, batch_size: int) -> Epoch:
    def run():
        order = torch.randperm(len(dataset)).tolist()
        return (dataset.get_batch(order[i:i + batch_size]) for i in range(0, len(order), batch_size))
    return run


def naive_loop(path: Path, batch_size: int) -> Epoch:
    """The ten lines a user writes over ``np.load(mmap_mode="r")``: sorted index slices, no checksums."""
    images, labels = np.load(path / "images.npy", mmap_mode="r"), np.load(path / "labels.npy")

    def run():
        order = torch.randperm(len(images)).numpy()
        for i in range(0, len(order), batch_size):
            idx = np.sort(order[i:i + batch_size])
            yield torch.from_numpy(images[idx]).permute(0, 3, 1, 2), torch.from_numpy(labels[idx])
    return run


def paths(path: Path, batch_size: int) -> Dict[str, Epoch]:
    checked, unchecked = open_dataset(path), open_dataset(path, checksums=False)
    loaders = {"make_loader": make_loader(checked, batch_size),
               "make_loader, checksums=False": make_loader(unchecked, batch_size),
               "make_loader, read_ahead=True": make_loader(checked, batch_size, read_ahead=True),
               "make_loader, 2 worker processes": make_loader(checked, batch_size, num_workers=2),
               "make_loader, contiguous_format": make_loader(checked, batch_size,
                                                             memory_format=torch.contiguous_format)}
    habitual = DataLoader(checked, batch_size, sampler=RandomSampler(checked), num_workers=2, persistent_workers=True)
    return {"naive np.load(mmap_mode='r') slices (no checksums)": naive_loop(path, batch_size),
            "dataset.get_batch loop": get_batch_loop(checked, batch_size),
            "dataset.get_batch loop, checksums=False": get_batch_loop(unchecked, batch_size),
            **{name: (lambda loader=loader: loader) for name, loader in loaders.items()},
            "habitual DataLoader, 2 workers": lambda: habitual}


def packed(args, tmp: Path) -> Path:
    if args.dataset:
        return Path(args.dataset)
    src = Path(args.src) if args.src else make_sample(tmp / "sample", args.count)
    pack(src, tmp / "pixels", "mmap", store="pixels", size=args.side, workers=os.cpu_count())
    return tmp / "pixels"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", help="a packed pixfeed mmap dataset of stored pixels")
    parser.add_argument("--src", help="an image folder to pack (stored pixels) instead of a synthetic sample")
    parser.add_argument("--count", type=int, default=2000, help="synthetic images (without --src or --dataset)")
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="epochs per row, one per round")
    parser.add_argument("--step-ms", type=float, default=0.0, help="simulated training step per batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = packed(args, Path(tmp))
        rows = paths(path, args.batch_size)
        shape = open_dataset(path).stored_shape
        print(f"{open_dataset(path).manifest['count']} images of {shape}, batch {args.batch_size}, "
              f"{args.rounds} rounds, {args.step_ms} ms step; load average before: {_load()}")
        best = dict.fromkeys(rows, 0.0)
        copy = 0.0
        for batches in rows.values():  # warm-up: the page cache, worker start-up
            epoch_rate(batches, 0.0)
        for _ in range(args.rounds):
            copy = max(copy, memcopy()["bytes_per_s"] / int(np.prod(shape)))
            for name, batches in rows.items():
                best[name] = max(best[name], epoch_rate(batches, args.step_ms / 1000))
        print(f"{'one thread memory copy (ceiling)':<52} {copy:>9,.0f} images/s")
        for name, rate in best.items():
            print(f"{name:<52} {rate:>9,.0f} images/s  {rate / copy:5.2f} x memory copy")
        print(f"load average after: {_load()}")
        goals(best, copy)


def goals(best: Dict[str, float], copy: float) -> None:
    loader, unchecked = best["make_loader"], best["make_loader, checksums=False"]
    for what, ratio, goal in (
            ("make_loader / get_batch loop (checksums)", loader / best["dataset.get_batch loop"], 0.9),
            ("make_loader / get_batch loop (no checksums)",
             unchecked / best["dataset.get_batch loop, checksums=False"], 0.9),
            ("make_loader (checksums) / one thread memory copy", loader / copy, 0.5),
            ("make_loader (no checksums) / naive memmap slices",
             unchecked / best["naive np.load(mmap_mode='r') slices (no checksums)"], 0.9)):
        print(f"goal {what:<52} {ratio:5.2f} (>= {goal}: {'met' if ratio >= goal else 'NOT met'})")
    print(f"{'make_loader contiguous_format / channels_last (default)':<57} "
          f"{best['make_loader, contiguous_format'] / loader:5.2f}")


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


if __name__ == "__main__":
    main()
