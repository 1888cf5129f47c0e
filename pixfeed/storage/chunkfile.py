"""Reading a remote data file through its chunk cache: ``ChunkFile`` and ``read_at`` / ``readinto_at``.

``ChunkFile`` is a read-only binary file object (``read``, ``readinto``,
``seek``, ``tell``) over a ``ChunkCache``: h5py opens it as a Python file
object, NumPy reads a ``.npy`` header from it, and the mmap reader copies
records out of it with ``readinto_at``, as it does with ``os.preadv`` on a
local file.  Each read opens the chunks it covers (fetching one no process of
the node has yet), copies from them with ``pread`` and closes them: no
descriptor is kept, so an evicted chunk's disk space is freed at once.
"""
from __future__ import annotations

import io
import os

import numpy as np

from .chunkcache import ChunkCache


class ChunkFile(io.RawIOBase):
    def __init__(self, cache: ChunkCache) -> None:
        super().__init__()
        self.cache, self.pos = cache, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.pos, self.cache.size)[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        n = self.readinto_at(buf, self.pos)
        self.pos += n
        return n

    def readinto_at(self, buf, offset: int) -> int:
        """Copy ``len(buf)`` bytes from ``offset`` (fewer at the end of the file); the bytes copied."""
        view = memoryview(buf).cast("B")
        end = min(offset + len(view), self.cache.size)
        done = 0
        while offset + done < end:
            k, within = divmod(offset + done, self.cache.chunk)
            want = min(end - offset - done, self.cache.chunk - within)
            fd = self.cache.open(k)
            try:
                got = os.preadv(fd, [view[done:done + want]], within)
            finally:
                os.close(fd)
            if got != want:
                break  # a chunk shorter than its span: the reader reports a truncated record
            done += got
        return done

    def read_at(self, n: int, offset: int) -> bytes:
        buf = bytearray(max(0, min(n, self.cache.size - offset)))
        return bytes(buf[:self.readinto_at(buf, offset)])


def readinto_at(f, buf, offset: int) -> int:
    """``os.preadv`` on a local file, or the same read through a ChunkFile."""
    return f.readinto_at(buf, offset) if isinstance(f, ChunkFile) else os.preadv(f.fileno(), [buf], offset)


def read_at(f, n: int, offset: int) -> bytes:
    return f.read_at(n, offset) if isinstance(f, ChunkFile) else os.pread(f.fileno(), n, offset)


def npy_layout(source) -> tuple:
    """(shape, data offset) of a ``.npy`` file, a local path or an open file (a ChunkFile; its header only)."""
    f = open(source, "rb") if isinstance(source, (str, os.PathLike)) else source
    try:
        f.seek(0)
        version = np.lib.format.read_magic(f)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, _ = header(f)
        return shape, f.tell()
    finally:
        if f is not source:
            f.close()
