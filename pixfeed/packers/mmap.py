"""Writer of the memory-mapped format.

Layout (all little-endian, readable with ``numpy.load(path, mmap_mode="r")``)::

    pixels mode   images.npy     uint8  N x H x W x 3  (RGB)
    encoded mode  data.bin       the image files' bytes, concatenated
                  offsets.npy    int64  N+1; record i is data.bin[offsets[i]:offsets[i+1]]
    both          labels.npy     int64  N   (-1 for a flat source)
                  checksums.npy  uint64 N   xxh3_64 of each record's stored bytes
                  keys.json, pixfeed.json

Pixels: ``begin`` sizes images.npy for every source image and each worker
writes its rows in place.  Encoded: each task writes a part file, and
``finish`` concatenates them in task order.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator, List

import numpy as np

from .records import Record
from .writer import TaskResult, Writer

_COPY_ROWS = 1024


class MmapWriter(Writer):
    format = "mmap"
    default_store = "pixels"

    @property
    def _images(self) -> Path:
        return self.root / "images.npy"

    def _part(self, task: int) -> Path:
        return self.root / "parts" / f"part-{task:06d}.bin"

    def begin(self, tasks: List[np.ndarray]) -> None:
        if self.opts.store == "pixels":
            h, w = self.opts.size
            np.lib.format.open_memmap(self._images, mode="w+", dtype=np.uint8,
                                      shape=(len(self.source), h, w, 3))
            _allocate(self._images)
        else:
            (self.root / "parts").mkdir()

    def write_task(self, task: int, indices: np.ndarray, records: Iterator[Record]) -> List[int]:
        if self.opts.store == "pixels":
            images = np.load(self._images, mmap_mode="r+")
            for rec in records:
                images[rec.index] = rec.data
            images.flush()
            return []
        lengths = []
        with open(self._part(task), "wb") as f:
            for rec in records:
                f.write(rec.data)
                lengths.append(len(rec.data))
        return lengths

    def finish(self, kept: np.ndarray, results: List[TaskResult]) -> dict:
        if self.opts.store == "pixels":
            if len(kept) < len(self.source):
                self._compact(kept)
        else:
            self._concatenate(results)
        labels = self.source.labels[kept]
        np.save(self.root / "labels.npy", labels.astype("<i8"))
        checksums = np.array([c for r in results for c in r.checksums], dtype="<u8")
        np.save(self.root / "checksums.npy", checksums)
        return {}

    def _compact(self, kept: np.ndarray) -> None:
        """Drop the rows of skipped images (rare: only with --on-error skip)."""
        old = np.load(self._images, mmap_mode="r")
        tmp = self.root / "images.compact.npy"
        new = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(kept), *old.shape[1:]))
        _allocate(tmp)
        for start in range(0, len(kept), _COPY_ROWS):
            new[start:start + _COPY_ROWS] = old[kept[start:start + _COPY_ROWS]]
        new.flush()
        del old, new
        tmp.replace(self._images)

    def _concatenate(self, results: List[TaskResult]) -> None:
        lengths = np.array([n for r in results for n in r.extra], dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype="<i8")
        np.cumsum(lengths, out=offsets[1:])
        with open(self.root / "data.bin", "wb") as out:
            for r in results:
                with open(self._part(r.task), "rb") as part:
                    shutil.copyfileobj(part, out, 16 << 20)
        shutil.rmtree(self.root / "parts")
        np.save(self.root / "offsets.npy", offsets)


def _allocate(path: Path) -> None:
    """Reserve a sparse file's blocks now: a full disk then raises ENOSPC here
    instead of killing the process with SIGBUS when a mapped page is written."""
    if hasattr(os, "posix_fallocate"):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        finally:
            os.close(fd)
