"""End to end: an encoded pack read through ``make_loader`` with ``size=224`` against
the same folder read by a torchvision-style dataset, as a ratio measured in one run.

    python benchmarks/bench_folder_vs_packed.py IMAGES [--epochs 6] [--max-side 384]

Baseline: ImageFolder-style dataset (PIL open, convert RGB, Resize(256),
CenterCrop(224), to a uint8 tensor) in a DataLoader with num_workers = CPUs
and persistent_workers=True.  Candidate: the folder packed as ``mmap --store
encoded`` and read with ``size=224`` (decode's fast path) through
``pixfeed.make_loader`` with its automatic settings, and once more packed with
``--max-side`` (re-encoded at pack time, FFCV's approach; 0 skips it).  After
one warm-up epoch each, timed epochs alternate between the loaders; the best
and the median epoch of each are reported (an epoch of 500 images lasts under
a second: one slow moment on a shared machine moves one epoch by 20%).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from pixfeed import make_loader, open_dataset, pack
from pixfeed.machine.cpus import available_cpus
from pixfeed.sources.folder import scan
from bench_decode import usual


class TorchvisionStyleFolder(torch.utils.data.Dataset):
    def __init__(self, root: Path) -> None:
        source = scan(root)
        self.files = [source.root / p for p in source.paths]
        self.labels = source.labels.tolist()

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        arr = usual(self.files[i].read_bytes())
        return torch.from_numpy(arr.copy()).permute(2, 0, 1), self.labels[i]


def epoch_seconds(loader) -> float:
    """One epoch; each batch is copied once into a reused buffer, the host side of the
    copy to the GPU a training step makes (a full ``images.sum()`` costs the main
    process 30 ms a batch here, a CPU load no GPU training loop has)."""
    buffers = {}
    start = time.perf_counter()
    for images, _ in loader:
        key = (images.shape, images.stride())
        buffers.setdefault(key, torch.empty_strided(images.shape, images.stride(), dtype=images.dtype)).copy_(images)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-side", type=int, default=384)
    args = ap.parse_args()
    cpus = available_cpus()
    with tempfile.TemporaryDirectory() as tmp:
        loaders = {"folder": torch.utils.data.DataLoader(TorchvisionStyleFolder(args.src), args.batch_size,
                                                         shuffle=True, num_workers=cpus, persistent_workers=True)}
        for name, max_side in (("packed", None), (f"packed --max-side {args.max_side}", args.max_side or None)):
            if name == "packed" or max_side:
                dst = Path(tmp) / f"packed-{max_side}"
                pack(args.src, dst, "mmap", store="encoded", max_side=max_side)
                loaders[name] = make_loader(open_dataset(dst, size=224), args.batch_size, shuffle=True)
        n = len(loaders["folder"].dataset)
        times = {name: [] for name in loaders}
        for epoch in range(args.epochs + 1):
            for name, loader in loaders.items():
                t = epoch_seconds(loader)
                if epoch:
                    times[name].append(t)
        print(f"{n} images, {cpus} CPUs, batch {args.batch_size}, {args.epochs} alternating epochs")
        print(f"make_loader plan:\n{loaders['packed'].pixfeed_plan}")
        best, median = ({k: f(v) for k, v in times.items()} for f in (min, np.median))
        print(f"{'':24s} {'best img/s':>10s} {'x folder':>8s} {'median img/s':>12s} {'x folder':>8s}")
        for name in loaders:
            print(f"{name:24s} {n / best[name]:10.0f} {best['folder'] / best[name]:8.2f} "
                  f"{n / median[name]:12.0f} {median['folder'] / median[name]:8.2f}")


if __name__ == "__main__":
    main()
