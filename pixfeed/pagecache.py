"""Page-cache control for cold reads: evict files, check that they left, time a read.

Eviction is ``fsync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every
file: no root needed, but the kernel may keep pages (tmpfs, some overlay and
network filesystems, pages mapped by another process).  ``resident_fraction``
asks the kernel (``mincore`` over a private mapping) how much of the files is
still cached, so the benchmark can say when a "cold" read was not cold.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

CHUNK = 8 << 20
_PAGE = mmap.PAGESIZE


def evict(files: Iterable[Path]) -> None:
    """Ask the kernel to drop ``files`` from the page cache."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _resident_pages(path: Path, libc) -> tuple:
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    pages = -(-size // _PAGE)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        vec = (ctypes.c_ubyte * pages)()
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        failed = libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec)
        resident = None if failed else sum(v & 1 for v in vec)
    return resident, pages


def resident_fraction(files: Iterable[Path]) -> Optional[float]:
    """Fraction of the files' pages in the page cache, or None when it cannot be told."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        counts = [_resident_pages(p, libc) for p in files]
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
        with open(path, "rb", buffering=0) as f:
            while True:
                start = time.perf_counter()
                n = f.readinto(buf)
                slowest = max(slowest, time.perf_counter() - start)
                if not n:
                    break
                total += n
    return total, slowest
