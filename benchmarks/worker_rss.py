"""Worker memory at the start and end of an epoch: an index in Python objects vs NumPy arrays.

    python benchmarks/worker_rss.py [--samples 1000000] [--workers 2]

Forked workers share the parent's pages until they write to them; merely
reading a Python object writes its reference count, so a worker that walks a
list of per-sample tuples slowly copies the whole index (pytorch#13246).  An
index in NumPy arrays holds no per-sample objects and stays shared.  Each
batch reports its worker's RSS and private (copied) memory from
``/proc/self/smaps_rollup``; the script prints both at the first and last batch.
"""
from __future__ import annotations

import argparse
import os
from typing import Dict, List, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def memory_mib() -> Tuple[float, float]:
    """(RSS, private) MiB of this process."""
    fields: Dict[str, int] = {}
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0])
    return fields["Rss"] / 1024, (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024


class ListIndex(Dataset):
    def __init__(self, count: int) -> None:
        self.items: List[Tuple[str, int]] = [(f"train/n{i % 1000:08d}/img_{i:08d}.JPEG", i % 1000)
                                             for i in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> int:
        path, label = self.items[index]
        return len(path) + label


class ArrayIndex(Dataset):
    def __init__(self, count: int) -> None:
        items = ListIndex(count).items
        self.paths = np.array([path for path, _ in items], dtype="S")
        self.labels = np.array([label for _, label in items], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> int:
        return len(self.paths[index]) + int(self.labels[index])


def report(batch: List[int]) -> Tuple[int, float, float]:
    """collate_fn: runs in the worker, after the batch was read."""
    return (os.getpid(), *memory_mib())


def epoch(dataset: Dataset, workers: int, batch_size: int) -> Dict[int, List[Tuple[float, float]]]:
    loader = DataLoader(dataset, batch_size, shuffle=True, num_workers=workers, collate_fn=report,
                        generator=torch.Generator().manual_seed(0))
    seen: Dict[int, List[Tuple[float, float]]] = {}
    for pid, rss, private in loader:
        seen.setdefault(pid, []).append((rss, private))
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    args = parser.parse_args()
    for cls in (ListIndex, ArrayIndex):
        seen = epoch(cls(args.samples), args.workers, args.batch_size)
        for worker, (pid, samples) in enumerate(sorted(seen.items())):
            (rss0, priv0), (rss1, priv1) = samples[0], samples[-1]
            print(f"{cls.__name__:<10} worker {worker}: RSS {rss0:7.1f} -> {rss1:7.1f} MiB, "
                  f"private (copied) {priv0:7.1f} -> {priv1:7.1f} MiB")


if __name__ == "__main__":
    main()
