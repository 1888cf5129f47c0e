"""How a pack task writes its records: rows of a pre-sized ``.npy`` in place, or a part file.

Used by the mmap writer for its own files and by the staging helper of the
single-writer formats for theirs (``pixfeed.packers.staging``); the file
names belong to the caller.
"""
from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from typing import Iterable, Iterator, List, Sequence, Tuple

import numpy as np

from ..console.words import human_bytes
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


def write_part(path: Path, records: Iterable[Sequence]) -> List[int]:
    """Write each record, a sequence of bytes-like parts, one after another into ``path`` (one
    ``writev`` a record); return the records' lengths."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return [writev_all(fd, parts) for parts in records]
    finally:
        os.close(fd)


def write_placed(path: Path, start: int, stop: int, part: Path, records: Iterable[Record]) -> Tuple[List[int], int]:
    """Write the records' bytes one after another into ``path`` from byte ``start``, the task's region
    up to ``stop`` (placed ahead from the source's sizes), while they fit; the rest into the part file
    ``part``.  Return their lengths and the bytes written in place."""
    lengths, pos, out = [], start, None
    fd = os.open(path, os.O_WRONLY)
    try:
        for rec in records:
            if out is None and pos + len(rec.data) <= stop:
                pos = _pwrite_all(fd, rec.data, pos)
            else:
                out = out or open(part, "wb")
                out.write(rec.data)
            lengths.append(len(rec.data))
    finally:
        os.close(fd)
        if out is not None:
            out.close()
    return lengths, pos - start


def writev_all(fd: int, buffers: List) -> int:
    """Write ``buffers`` one after another at ``fd``'s position, in one ``writev`` (a regular file takes
    them all); what a short write leaves (a signal, a pipe) is joined and written after.  Return the
    bytes written."""
    views = [memoryview(b) for b in buffers]
    done, total = os.writev(fd, views), sum(v.nbytes for v in views)
    rest = memoryview(b"".join(views))[done:] if done < total else None
    while rest:
        n = os.write(fd, rest)
        if n == 0:
            raise OSError(errno.EIO, "write wrote nothing")
        rest = rest[n:]
    return total


def _pwrite_all(fd: int, data, pos: int) -> int:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, pos)
        pos, view = pos + done, view[done:]
    return pos


def copy_range(f, src: int, out, dst: int, count: int, chunk: int = 16 << 20) -> int:
    """Copy ``count`` bytes at offset ``src`` of the open file ``f`` to offset ``dst`` of ``out`` (file
    positions are left alone); return ``count``.  The kernel copies (``copy_file_range``: 0.3 s for a
    GB where ``shutil.copyfileobj`` took 2-3 s here); where it refuses (another file system, ranges
    overlapping in one file), a front-to-back loop of reads and writes does, so ``out`` may be ``f``
    itself when dst <= src."""
    fin, fout, done = f.fileno(), out.fileno(), 0
    try:
        while done < count:
            n = os.copy_file_range(fin, fout, count - done, src + done, dst + done)
            if n == 0:
                raise OSError(errno.EIO, f"{getattr(f, 'name', 'file')}: ends before byte {src + count}")
            done += n
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.EBADF):
            raise
        for k in range(done, count, chunk):
            _pwrite_all(fout, os.pread(fin, min(chunk, count - k), src + k), dst + k)
    return count


def read_part(path: Path, lengths: Sequence[int]) -> Iterator[memoryview]:
    """The records of a part file written by ``write_part``, as views of a map of the file (no copy;
    the map lives as long as a view of it)."""
    if not sum(lengths):
        yield from (memoryview(b"") for _ in lengths)
        return
    with open(path, "rb") as f:
        view = memoryview(mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                                    prot=mmap.PROT_READ))
    pos = 0
    for length in lengths:
        yield view[pos:pos + length]
        pos += length


def reserve(fd: int, nbytes: int, where: object = None) -> None:
    """Reserve the blocks of the first ``nbytes`` of the open file ``fd`` (extending it to them): a full
    disk then raises ENOSPC here, before any record is written, and writes into reserved blocks cost
    the kernel less than into a sparse or growing file (a repack of 1.1 GB into a placed data.bin:
    0.50-0.60 s of the workers' system time, against 0.59-0.71).  A writer that writes less truncates
    the file to what it wrote.  ``nbytes`` comes from input (file sizes, a dataset's offsets), so the
    file system's free space is checked first: a reservation that would leave less than ``HEADROOM`` of
    it free is ENOSPC (an OSError naming ``where``, which the pack reports as an OutputError naming DST)
    and nothing is reserved: the disk is never filled to 100% by what input claims."""
    if hasattr(os, "posix_fallocate") and nbytes > 0:
        check_space(fd, nbytes, where)
        os.posix_fallocate(fd, 0, nbytes)


HEADROOM = (256 << 20, 100)  # a reservation leaves at least min(256 MiB, 1% of the file system) free


def check_space(fd: int, nbytes: int, where: object = None) -> None:
    """ENOSPC unless the file system of ``fd`` can take ``nbytes`` more for it (blocks it already holds
    count as its own) and keep ``HEADROOM`` free."""
    fs, st = os.fstatvfs(fd), os.fstat(fd)
    free, total = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
    keep = min(HEADROOM[0], total // HEADROOM[1])
    needed = nbytes - min(st.st_blocks * 512, nbytes)
    if needed > max(free - keep, 0):
        raise OSError(errno.ENOSPC, f"No space left on device: the pack would reserve {human_bytes(nbytes)} for "
                      f"{Path(str(where)).name if where else 'a file'}, and its file system has {human_bytes(free)} "
                      f"free (of {human_bytes(total)}, keeping {human_bytes(keep)} for others), so nothing was "
                      "reserved: free some space or choose a DST on a larger file system", where and str(where))


def allocate(path: Path) -> None:
    """Reserve a sparse file's blocks now (``reserve``): a full disk fails here instead of killing the
    process with SIGBUS when a mapped page is written."""
    if hasattr(os, "posix_fallocate"):
        fd = os.open(path, os.O_RDWR)
        try:
            reserve(fd, os.fstat(fd).st_size, path)
        finally:
            os.close(fd)
