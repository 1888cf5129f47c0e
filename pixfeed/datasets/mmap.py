"""Reader of the memory-mapped format (layout: pixfeed.packers.mmap)."""
from __future__ import annotations

import numpy as np

from .base import MapImageDataset


class MmapImageDataset(MapImageDataset):
    """``MmapImageDataset(path, transform=None, *, size=None, crop="center", verify=True)``.

    A batch of indices is one gathered copy out of the memory map (pixels
    mode) or one pass over ``data.bin`` slices (encoded mode).
    """
    format = "mmap"

    def _open(self) -> dict:
        load = lambda name: np.load(self.path / name, mmap_mode="r", allow_pickle=False)  # noqa: E731
        arrays = {"labels": load("labels.npy"), "checksums": load("checksums.npy")}
        if self.store == "pixels":
            arrays["images"] = load("images.npy")
        else:
            arrays["offsets"] = load("offsets.npy")
            arrays["data"] = np.memmap(self.path / "data.bin", dtype=np.uint8, mode="r")
        return arrays

    def _read(self, indices: np.ndarray):
        h = self.handle
        if self.store == "pixels":
            stored = h["images"][indices]  # a gathered copy, writable
        else:
            starts, ends = h["offsets"][indices], h["offsets"][indices + 1]
            stored = [h["data"][s:e] for s, e in zip(starts, ends)]
        return stored, h["labels"][indices], h["checksums"][indices]
