"""Page-cache control: evict files, check that they left, time a read, read ahead, unmap.

Eviction is ``fsync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every
file: no root needed, but the kernel may keep pages (tmpfs, some overlay and
network filesystems, pages mapped by another process).  ``resident_fraction``
asks the kernel (``mincore`` over a private mapping) how much of the files is
still cached, so the benchmark can say when a "cold" read was not cold.

Read-ahead: ``Extents`` says where each record of a dataset lies in its data
file; ``will_need`` asks the kernel (``posix_fadvise(POSIX_FADV_WILLNEED)``) to
start reading byte ranges into the cache without waiting for them, sorted by
offset and merged where they touch.  ``unmap_pages`` drops this process's
mapped pages of a file (``madvise(MADV_DONTNEED)``; they stay in the page
cache), so reading through a library's memory map does not grow the RSS.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Tuple

import numpy as np

from .bounded import open_regular

CHUNK = 8 << 20
_PAGE = mmap.PAGESIZE
_WINDOW = 16  # pages per sampled run (resident_fraction with windows)
_MADV_DONTNEED = 4


class Extents:
    """Record ``i`` of a dataset is ``lengths[i]`` bytes at ``starts[i]`` of ``path``; ``whole``
    lists small files (labels, checksums) read for every record, best cached whole.  With ``ranges``
    instead of the arrays, ``of(records)`` asks ``ranges(records)`` for the records read-ahead is
    about to request, a window of the order at a time: nothing per record is kept (a row arithmetic,
    the dataset's memory-mapped offsets, a lookup per record; LMDB's never at ``make_loader``, only in
    an epoch that asks for read-ahead); ``count`` records, ``mean_length`` known before any.  With
    ``lookups`` above 1, ``of`` runs that many ``ranges`` calls at once on parts of the records: an LMDB
    lookup on a cold file waits for a page of the value (6 ms each here, serially; 16 at once: 12x)."""

    def __init__(self, path, starts: Optional[np.ndarray] = None, lengths: Optional[np.ndarray] = None,
                 whole: Optional[List[Path]] = None, *,
                 ranges: Optional[Callable[[np.ndarray], Tuple[np.ndarray, np.ndarray]]] = None,
                 count: Optional[int] = None, mean_length: Optional[float] = None) -> None:
        self.path, self.whole = path, list(whole or [])
        self._arrays = None if starts is None else (np.asarray(starts), np.asarray(lengths))
        self._ranges, self._mean = ranges, mean_length
        self.count = len(self._arrays[0]) if self._arrays is not None else count
        self.lookups = 1  # ranges() calls run at once, each on a part of the records (a lookup may wait on storage)

    def of(self, records: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(starts, lengths) as int64 of ``records`` (an array of record indices), in their order."""
        records = np.asarray(records)
        if self._arrays is not None:
            return (self._arrays[0][records].astype(np.int64, copy=False),
                    self._arrays[1][records].astype(np.int64, copy=False))
        if self.lookups > 1 and len(records) > self.lookups:
            with ThreadPoolExecutor(self.lookups, thread_name_prefix="pixfeed-extents") as pool:
                parts = list(pool.map(self._ranges, np.array_split(records, self.lookups)))
            return (np.concatenate([np.asarray(s, np.int64) for s, _ in parts]),
                    np.concatenate([np.asarray(n, np.int64) for _, n in parts]))
        starts, lengths = self._ranges(records)
        return np.asarray(starts, np.int64), np.asarray(lengths, np.int64)

    @property
    def starts(self) -> np.ndarray:
        """Every record's start (made whole when asked: tools over every record, not read-ahead)."""
        return self._arrays[0] if self._arrays is not None else self.of(np.arange(self.count))[0]

    @property
    def lengths(self) -> np.ndarray:
        return self._arrays[1] if self._arrays is not None else self.of(np.arange(self.count))[1]

    @property
    def mean_length(self) -> float:
        if self._mean is None:
            self._mean = float(self.lengths.mean()) if self.count else 1.0
        return self._mean


def will_need(fd: int, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Start reading the byte ranges into the page cache (in file order, touching ranges merged)."""
    _advise(fd, starts, lengths, os.POSIX_FADV_WILLNEED)


def dont_need(fd: int, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Drop the pages wholly inside the byte ranges from the page cache."""
    _advise(fd, starts, lengths, os.POSIX_FADV_DONTNEED)


def _advise(fd: int, starts: np.ndarray, lengths: np.ndarray, advice: int) -> None:
    some = lengths > 0  # a length of 0 is no record here (posix_fadvise would take it as "to the end of the file")
    starts, lengths = starts[some], lengths[some]
    if not len(starts):
        return
    order = np.argsort(starts, kind="stable")
    begin, end = starts[order], starts[order] + lengths[order]
    breaks = np.flatnonzero(begin[1:] > np.maximum.accumulate(end)[:-1]) + 1
    for first, last in zip(np.r_[0, breaks], np.r_[breaks, len(begin)]):
        os.posix_fadvise(fd, int(begin[first]), int(end[first:last].max() - begin[first]), advice)


def _mappings(path: Path) -> List[tuple]:
    """(start, end) addresses of this process's mappings of ``path``."""
    target, found = str(Path(path).resolve()), []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n") == target:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                found.append((lo, hi))
    return found


def mapping_base(path: Path) -> int:
    """The lowest address this process maps ``path`` at (a library's whole-file map starts there)."""
    found = _mappings(path)
    if not found:
        raise OSError(f"{path} is not memory-mapped in this process")
    return min(lo for lo, _ in found)


def unmap_pages(path: Path) -> None:
    """Drop this process's mapped pages of ``path`` (a read-only mapping faults them back from the cache)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for lo, hi in _mappings(path):
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)


def evict(files: Iterable[Path]) -> None:
    """Ask the kernel to drop ``files`` from the page cache."""
    for path in files:
        fd = open_regular(path)  # a FIFO is refused, not waited on
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@functools.lru_cache(maxsize=None)
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)  # find_library runs ldconfig: once


def _resident_pages(path: Path, libc, windows: Optional[int]) -> tuple:
    """(resident, checked) pages of ``path``: every page, or ``windows`` evenly spaced runs of
    ``_WINDOW`` pages when the file has more (``mincore`` costs ~20 ms a GB over every page)."""
    with os.fdopen(open_regular(path), "rb") as f:  # a FIFO is refused, not waited on
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return 0, 0
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    pages = -(-size // _PAGE)
    spans = [(0, pages)] if windows is None or pages <= windows * _WINDOW else \
        [(k * (pages - _WINDOW) // (windows - 1), _WINDOW) for k in range(windows)]
    with m:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        resident = 0
        for first, count in spans:
            vec = (ctypes.c_ubyte * count)()
            length = min(count * _PAGE, size - first * _PAGE)
            if libc.mincore(ctypes.c_void_p(addr + first * _PAGE), ctypes.c_size_t(length), vec):
                return None, pages
            resident += int(np.count_nonzero(np.frombuffer(vec, np.uint8) & 1))
    return resident, sum(count for _, count in spans)


def resident_fraction(files: Iterable[Path], windows: Optional[int] = None) -> Optional[float]:
    """Fraction of the files' pages in the page cache, or None when it cannot be told; with
    ``windows``, estimated from that many evenly spaced runs of pages per large file."""
    try:
        counts = [_resident_pages(p, libc(), windows) for p in files]
    except (OSError, TypeError, ValueError, BufferError):
        return None
    if any(r is None for r, _ in counts):
        return None
    total = sum(n for _, n in counts)
    return sum(r for r, _ in counts) / total if total else 0.0


def read_rate(files: List[Path], cold: bool) -> dict:
    """Bytes/s of reading ``files`` once in order; ``cold`` evicts them first (and checks)."""
    if cold:
        evict(files)
    else:
        _read_all(files)
    resident = resident_fraction(files) if cold else None
    start = time.perf_counter()
    nbytes, slowest = _read_all(files)
    seconds = max(time.perf_counter() - start, 1e-9)
    return {"bytes_per_s": nbytes / seconds, "bytes": nbytes, "seconds": seconds,
            "resident_before": resident, "slowest_read_s": slowest}


def _read_all(files: List[Path]) -> Tuple[int, float]:
    """(bytes read, seconds of the slowest single read of up to CHUNK bytes)."""
    total, slowest = 0, 0.0
    buf = bytearray(CHUNK)
    for path in files:
        with os.fdopen(open_regular(path), "rb", buffering=0) as f:  # a FIFO or device refused, never read
            left = os.fstat(f.fileno()).st_size  # no more than the file held when opened (one that grows ends)
            while left > 0:
                start = time.perf_counter()
                n = f.readinto(memoryview(buf)[:min(len(buf), left)])
                slowest = max(slowest, time.perf_counter() - start)
                if not n:
                    break
                total, left = total + n, left - n
    return total, slowest
