"""How a pack task writes its records: rows of a pre-sized ``.npy`` in place, or a part file.

Used by the mmap writer for its own files and by the staging helper of the
single-writer formats for theirs (``pixfeed.packers.staging``); the file
names belong to the caller.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator, List, Tuple

import numpy as np

from .records import Record


def allocate_rows(path: Path, count: int, size: Tuple[int, int]) -> None:
    """Create ``path`` as a uint8 count x H x W x 3 ``.npy`` with its blocks reserved."""
    np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(count, *size, 3))
    allocate(path)


def write_rows(path: Path, records: Iterable[Record]) -> None:
    """Write each record's pixels into its source row of ``path``."""
    images = np.load(path, mmap_mode="r+")
    for rec in records:
        images[rec.index] = rec.data
    images.flush()


def write_part(path: Path, records: Iterable[Record]) -> List[int]:
    """Write the records' bytes one after another into ``path``; return their lengths."""
    lengths = []
    with open(path, "wb") as f:
        for rec in records:
            f.write(rec.data)
            lengths.append(len(rec.data))
    return lengths


def read_part(path: Path, lengths: Iterable[int]) -> Iterator[bytes]:
    """The records' bytes of a part file written by ``write_part``."""
    with open(path, "rb") as f:
        for length in lengths:
            yield f.read(length)


def allocate(path: Path) -> None:
    """Reserve a sparse file's blocks now: a full disk then raises ENOSPC here
    instead of killing the process with SIGBUS when a mapped page is written."""
    if hasattr(os, "posix_fallocate"):
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        finally:
            os.close(fd)
