"""Reader of the memory-mapped format (layout: pixfeed.layouts.mmap).

Records are read with ``pread`` into their destination (a row of the batch,
or a bytes object for an encoded image), not through a memory map: the
bytes land where they are used in one copy, the pages stay in the page cache
without being mapped into the process, so its RSS stays flat however much of a
dataset larger than memory it reads, and each record is hashed right after its
copy, while it is still in the CPU cache.  Labels, checksums and offsets
(16-24 bytes a record) are memory-mapped.
"""
from __future__ import annotations

import os

import numpy as np

from ..checksum import record_hash
from ..errors import CorruptDataError
from ..layouts import mmap as layout
from ..pagecache import Extents
from .base import MapImageDataset


class MmapImageDataset(MapImageDataset):
    """``MmapImageDataset(path, transform=None, *, size=None, crop="center", crop_ratio=None,
    checksums=True, exact=False)``.

    A batch of indices is one pass of ``pread`` calls, one per record, into
    one batch array (pixels mode) or bytes objects (encoded mode).
    """
    format = "mmap"

    def _open(self) -> dict:
        load = lambda name: np.load(self.path / name, mmap_mode="r", allow_pickle=False)  # noqa: E731
        arrays = {"labels": load(layout.LABELS), "checksums": load(layout.CHECKSUMS)}
        if self.store == "pixels":
            arrays["base"] = load(layout.IMAGES).offset
            arrays["file"] = open(self.path / layout.IMAGES, "rb", buffering=0)
        else:
            arrays["offsets"] = load(layout.OFFSETS)
            arrays["file"] = open(self.path / layout.DATA, "rb", buffering=0)
        return arrays

    def read_checked(self, indices):
        idx = self._indices(indices)
        stored, labels, _ = self.read_stored(idx, check=self.checksums)
        return idx, stored, labels

    def read_stored(self, indices: np.ndarray, check: bool = False):
        """(records, labels, checksums); with ``check``, each record is hashed just after its read
        (CorruptDataError on a mismatch)."""
        h = self.handle
        checksums = h["checksums"][indices]
        fd = h["file"].fileno()
        if self.store == "pixels":
            stored = np.empty((len(indices), *self.stored_shape), np.uint8)
            row = stored[0].nbytes if len(indices) else 0
            for j, i in enumerate(indices):
                if os.preadv(fd, [stored[j]], h["base"] + int(i) * row) != row:  # releases the GIL
                    raise self._short(int(i))
                self._check(check, stored[j], checksums[j], int(i))
        else:
            stored = []
            for j, (start, end) in enumerate(zip(h["offsets"][indices], h["offsets"][indices + 1])):
                stored.append(os.pread(fd, int(end - start), int(start)))
                if len(stored[j]) != end - start:
                    raise self._short(int(indices[j]))
                self._check(check, stored[j], checksums[j], int(indices[j]))
        return stored, h["labels"][indices], checksums

    def _check(self, check: bool, record, expected, i: int) -> None:
        if check and record_hash(record) != int(expected):
            self.check_checksum(record, expected, i)  # raises, naming the record

    def _short(self, i: int) -> CorruptDataError:
        return CorruptDataError(f"{self.where(i)}: the data file ends inside the record (truncated); "
                                f"run 'pixfeed verify {self.path}'")

    def record_extents(self) -> Extents:
        """Where each record's stored bytes lie in its data file (for read-ahead hints)."""
        meta = [self.path / name for name in (layout.LABELS, layout.CHECKSUMS)]
        if self.store == "pixels":
            images = np.load(self.path / layout.IMAGES, mmap_mode="r", allow_pickle=False)
            row = int(np.prod(images.shape[1:]))
            starts = images.offset + row * np.arange(len(images), dtype=np.int64)
            return Extents(self.path / layout.IMAGES, starts, np.full(len(images), row, np.int64), meta)
        offsets = np.load(self.path / layout.OFFSETS, allow_pickle=False).astype(np.int64)
        return Extents(self.path / layout.DATA, offsets[:-1], np.diff(offsets), [*meta, self.path / layout.OFFSETS])
