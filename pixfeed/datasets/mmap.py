"""Reader of the memory-mapped format (layout: pixfeed.layouts.mmap)."""
from __future__ import annotations

import numpy as np

from ..layouts import mmap as layout
from .base import MapImageDataset


class MmapImageDataset(MapImageDataset):
    """``MmapImageDataset(path, transform=None, *, size=None, crop="center", crop_ratio=None,
    checksums=True, exact=False)``.

    A batch of indices is one gathered copy out of the memory map (pixels
    mode) or one pass over ``data.bin`` slices (encoded mode).
    """
    format = "mmap"

    def _open(self) -> dict:
        load = lambda name: np.load(self.path / name, mmap_mode="r", allow_pickle=False)  # noqa: E731
        arrays = {"labels": load(layout.LABELS), "checksums": load(layout.CHECKSUMS)}
        if self.store == "pixels":
            arrays["images"] = load(layout.IMAGES)
        else:
            arrays["offsets"] = load(layout.OFFSETS)
            arrays["data"] = np.memmap(self.path / layout.DATA, dtype=np.uint8, mode="r")
        return arrays

    def read_stored(self, indices: np.ndarray):
        h = self.handle
        if self.store == "pixels":
            stored = _gather_rows(h["images"], indices)
        else:
            starts, ends = h["offsets"][indices], h["offsets"][indices + 1]
            stored = [h["data"][s:e] for s, e in zip(starts, ends)]
        return stored, h["labels"][indices], h["checksums"][indices]


def _gather_rows(images: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Copy rows into a new batch array one by one.

    Each row copy releases the GIL, so a read-ahead thread gathering the next
    batch does not stall the training loop; one fancy-indexed gather out of a
    memmap holds the GIL for the whole batch (0.9 ms -> 5.8 ms for 64 x 224^2
    beside a busy Python thread, benchmarks/loader_paths.py).
    """
    out = np.empty((len(indices), *images.shape[1:]), dtype=images.dtype)
    for j, i in enumerate(indices):
        out[j] = images[i]
    return out
