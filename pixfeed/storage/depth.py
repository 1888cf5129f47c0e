"""Reads with depth: byte ranges read by a few threads at once, several requests in flight.

``posix_fadvise(WILLNEED)`` leaves it to the kernel how many reads of the
ranges it queues; a reader that faults the pages of a mapped file or ``pread``s
them asks for one range at a time.  ``Reads`` keeps ``depth`` requests in flight
instead: a pool of ``depth`` threads, each with one reusable buffer of
``PIECE`` bytes (anonymous memory, mapped once), doing ``os.preadv`` (which
releases the GIL) on ranges handed to it already sorted by offset and merged
where they touch or lie within ``NEAR`` bytes of each other (``coalesce``), cut
into pieces of at most ``PIECE`` bytes.  The bytes land in the page cache,
where the readers find them: the buffers are overwritten by the next read (the
page cache is the hand-off; reading the records straight out of the buffers
would be a change to the readers).  Its own descriptor is opened with
``POSIX_FADV_RANDOM``, so the kernel reads exactly the pieces asked for and
adds no read-ahead of its own to them.  A piece whose records were all handed
out more than ``lag`` positions ago is skipped (the reader has them); the pool
stops at once when told to, and a read that fails ends it quietly: this is
advice, and the reader names a file that vanished or shrank when it reads it.

Whether to use it: ``choose_io_depth`` (``make_loader``'s ``io_depth="auto"``)
keeps ``posix_fadvise(WILLNEED)`` (depth 0) where the kernel honours it
(``willneed_honoured``: a few pages not cached are advised, and ``mincore``
says whether they came; once per device and process): it queues a whole
top-up's reads at once, deeper than any pool of threads, and copies nothing.
On the 2-CPU dev machine it read cold shuffled epochs at 1.67 GB/s against
1.28 with 16 threads, and was ahead in every other cold row of
``bench_bigdata.py`` (the pool's copies and its threads' turns at the GIL take
the CPU the reader needs).  Where the advice is ignored (some FUSE and ZFS
mounts) the pool reads ahead instead, ``choose_depth`` reads in flight: 2 on a
rotational disk (``queue/rotational``), else 16.  An O_DIRECT probe of random
reads at depths 1, 4 and 16 was tried for choosing the depth and dropped: on
this virtual disk a 50 ms probe ranked the depths differently from run to run.

``sequential_rate`` reads files in order with ``depth`` reads in flight: the
reference a cold epoch is compared with (one stream, ``pagecache.read_rate``,
gets a fraction of what a device with a deep queue gives), through
``ranges_rate``, which reads given ranges the same way.
"""
from __future__ import annotations

import collections
import ctypes
import mmap
import os
import threading
import time
from typing import Callable, List, Optional, Tuple

import numpy as np

from ..errors import PixfeedError
from .bounded import open_regular
from .pagecache import libc

PIECE = 1 << 20  # bytes of one read (each thread's buffer)
NEAR = 32 << 10  # ranges closer than this are read as one (the gap read with them: less than one request costs)
SOLID_DEPTH = 16  # reads in flight on an SSD/NVMe device (or one of unknown kind)
ROTATIONAL_DEPTH = 2  # on a spinning disk: more requests only make its head seek between them
PROBE_PAGES = 8  # pages advised by willneed_honoured
PROBE_SECONDS = 0.2  # and how long it waits for one of them at most (a page read takes well under 10 ms)
WILLNEED_WHY = ("cold shuffled epochs of 0.92 GiB of 256x256 pixels on the 2-CPU dev machine read at 1.67 GB/s "
                "with WILLNEED against 1.28 with 16 threads (bench_bigdata.py --cold-only)")

Reader = Callable[[int, list, int], int]  # os.preadv's signature: (fd, buffers, offset) -> bytes read


def coalesce(starts: np.ndarray, lengths: np.ndarray, tags: Optional[np.ndarray] = None,
             near: int = NEAR) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(begins, ends, last tags) of the ranges sorted by offset, merged where they overlap, touch or lie within
    ``near`` bytes of each other; a length of 0 is no range.  ``tags`` (e.g. positions in an epoch's order): the
    largest of each merged range's (zeros without)."""
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    tags = np.zeros(len(starts), np.int64) if tags is None else np.asarray(tags, np.int64)
    some = lengths > 0
    starts, lengths, tags = starts[some], lengths[some], tags[some]
    if not len(starts):
        return (np.zeros(0, np.int64),) * 3
    order = np.argsort(starts, kind="stable")
    begin, end = starts[order], starts[order] + lengths[order]
    breaks = np.flatnonzero(begin[1:] > np.maximum.accumulate(end)[:-1] + near) + 1
    firsts = np.r_[0, breaks]
    return begin[firsts], np.maximum.reduceat(end, firsts), np.maximum.reduceat(tags[order], firsts)


def pieces(begins: np.ndarray, ends: np.ndarray, tags: np.ndarray, piece: int = PIECE) -> np.ndarray:
    """Rows (offset, length, tag) cutting each range into reads of at most ``piece`` bytes."""
    counts = -(-(ends - begins) // piece)
    first = np.repeat(begins, counts)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    offsets = first + within * piece
    return np.stack([offsets, np.minimum(offsets + piece, np.repeat(ends, counts)) - offsets,
                     np.repeat(tags, counts)], axis=1)


class Reads:
    """``depth`` threads reading the pieces of the ranges given to ``add`` from ``path``, in the order given.

    ``position`` is the reader's position in the order: a piece whose tags are all below ``position - lag``
    is skipped.  ``stop()`` drops what is queued; ``close()`` waits for the queue to be read (unless stopped)
    and ends the threads.  ``reads`` counts the reads made, ``failed`` holds the error that ended them."""

    def __init__(self, path, depth: int, lag: int = 0, read: Reader = os.preadv, piece: int = PIECE,
                 near: int = NEAR) -> None:
        self.fd = open_regular(path)  # a FIFO swapped in is refused, never waited on
        try:
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)  # exactly the pieces asked for: no kernel read-ahead
        except OSError:
            pass
        self.depth, self.lag, self.read, self.piece, self.near = max(int(depth), 1), lag, read, piece, near
        self.position, self.reads, self.bytes, self.failed = 0, 0, 0, None
        self.stopped = False
        self._queue: collections.deque = collections.deque()  # (offset, length, tag) of each piece to read
        self._busy = 0
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # a piece is queued (or the pool stops)
        self._idle = threading.Condition(self._lock)  # nothing queued or in flight
        self._closing = False
        self._threads = [threading.Thread(target=self._work, name="pixfeed-io-depth", daemon=True)
                         for _ in range(self.depth)]
        for thread in self._threads:
            thread.start()

    def add(self, starts: np.ndarray, lengths: np.ndarray, tags: Optional[np.ndarray] = None) -> None:
        """Queue the ranges (coalesced, in file order) to be read."""
        rows = pieces(*coalesce(starts, lengths, tags, self.near), piece=self.piece).tolist()
        if rows:
            with self._lock:
                if self.stopped:  # stopped or failed: nothing more is read
                    return
                self._queue.extend(rows)
                self._ready.notify(min(len(rows), self.depth))

    def _next(self, got: Optional[int]) -> Optional[tuple]:
        """Count the read just made (``got`` bytes; None before the first), then the next piece to read."""
        with self._lock:
            if got is not None:
                self._busy -= 1
                self.reads += 1
                self.bytes += got
            while True:
                while self._queue and not self.stopped:
                    offset, length, tag = self._queue.popleft()
                    if tag >= self.position - self.lag:
                        self._busy += 1
                        return offset, length
                if not self._busy:
                    self._idle.notify_all()
                if self.stopped or self._closing:
                    return None
                self._ready.wait()

    def _work(self) -> None:
        buffer = mmap.mmap(-1, self.piece)  # anonymous: page-aligned, untouched until read into
        view = memoryview(buffer)
        got = None
        try:
            while True:
                job = self._next(got)
                if job is None:
                    return
                offset, length = job
                try:
                    got = self.read(self.fd, [view[:length]], offset)
                except OSError as e:  # advice only: the reader names a file that vanished or shrank
                    got, self.failed = 0, e.with_traceback(None)  # its frames held the buffer's slice: close failed
                    self.stop()
        finally:
            view.release()
            buffer.close()

    def wait_idle(self, deadline: Optional[float] = None) -> bool:
        """Wait until every queued piece is read (or ``deadline``, a ``time.monotonic()`` value); whether it was."""
        with self._lock:
            while self._queue or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if self.stopped or (left is not None and left <= 0):
                    return False
                self._idle.wait(left)
            return True

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            self._queue.clear()
            self._ready.notify_all()
            self._idle.notify_all()

    def close(self) -> None:
        """Read what is queued (nothing once stopped), end the threads, close the descriptor."""
        with self._lock:
            self._closing = True
            self._ready.notify_all()
        for thread in self._threads:
            thread.join()
        os.close(self.fd)


def sequential_rate(files: List, depth: int, piece: int = PIECE, limit: Optional[int] = None) -> dict:
    """Bytes/s of reading ``files`` once in order (at most ``limit`` bytes of each), ``depth`` reads of ``piece``
    bytes in flight (through the page cache: evict the files first for a cold read)."""
    start, total = time.perf_counter(), 0
    for path in files:
        size = os.stat(path).st_size if limit is None else min(os.stat(path).st_size, limit)
        total += ranges_rate(path, np.zeros(1, np.int64), np.array([size], np.int64), depth, piece)["bytes"]
    seconds = max(time.perf_counter() - start, 1e-9)
    return {"bytes_per_s": total / seconds, "bytes": total, "seconds": seconds, "depth": depth}


def ranges_rate(path, starts: np.ndarray, lengths: np.ndarray, depth: int, piece: int = PIECE,
                deadline: Optional[float] = None) -> dict:
    """Bytes/s of reading the ranges with ``depth`` reads in flight (coalesced, in file order); with ``deadline``
    (a ``time.monotonic()`` value) the reads still queued then are dropped."""
    reads = Reads(path, depth, piece=piece)
    start = time.perf_counter()
    try:
        reads.add(starts, lengths)
        reads.wait_idle(deadline)
        reads.stop()
    finally:
        reads.close()
    seconds = max(time.perf_counter() - start, 1e-9)
    return {"bytes_per_s": reads.bytes / seconds, "bytes": reads.bytes, "seconds": seconds, "reads": reads.reads}


def rotational(path) -> Optional[bool]:
    """The ``queue/rotational`` flag of the block device holding ``path`` (its disk's for a partition), or None."""
    try:
        dev = os.stat(path).st_dev
        block = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
        for queue in (f"{block}/queue/rotational", f"{block}/../queue/rotational"):
            if os.path.exists(queue):
                with open(queue) as f:
                    return f.read().strip() == "1"
    except (OSError, ValueError):
        pass
    return None


def willneed_honoured(path, pages: int = PROBE_PAGES, seconds: float = PROBE_SECONDS) -> Optional[bool]:
    """Whether ``posix_fadvise(WILLNEED)`` reads pages of ``path`` into the page cache here: up to ``pages``
    pages not in the cache (of 64 evenly spaced) are advised, then asked of ``mincore`` until one is cached or
    ``seconds`` pass (False: the file system ignores the advice); None when every sampled page is cached
    already (nothing to tell) or it cannot be told."""
    try:
        fd = open_regular(path)  # a FIFO swapped in is refused, never waited on
    except (OSError, PixfeedError):
        return None
    try:
        count = os.fstat(fd).st_size // mmap.PAGESIZE
        if not count:
            return None
        m = mmap.mmap(fd, count * mmap.PAGESIZE, access=mmap.ACCESS_COPY)  # never written: no page copied
    except (OSError, ValueError):
        os.close(fd)
        return None
    try:
        with m:
            base = ctypes.addressof(ctypes.c_char.from_buffer(m))
            cold = [p for p in sorted(set(np.linspace(0, count - 1, 64).astype(int).tolist()))
                    if _resident(base, p) is False][:pages]
            if not cold:
                return None
            for page in cold:
                os.posix_fadvise(fd, page * mmap.PAGESIZE, mmap.PAGESIZE, os.POSIX_FADV_WILLNEED)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if any(_resident(base, p) for p in cold):
                    return True
                time.sleep(0.002)
            return False
    except OSError:
        return None
    finally:
        os.close(fd)


def _resident(base: int, page: int) -> Optional[bool]:
    vec = (ctypes.c_ubyte * 1)()
    if libc().mincore(ctypes.c_void_p(base + page * mmap.PAGESIZE), ctypes.c_size_t(mmap.PAGESIZE), vec):
        return None
    return bool(vec[0] & 1)


def choose_depth(path) -> Tuple[int, str]:
    """(depth, reason) of the pool for ``path`` (used where WILLNEED is not honoured, or asked for): from the
    device's ``queue/rotational`` flag (virtual disks often say rotational when they are not: give io_depth)."""
    spinning = rotational(path)
    if spinning:
        return ROTATIONAL_DEPTH, "a rotational disk (queue/rotational): few reads in flight"
    return SOLID_DEPTH, f"{'an SSD' if spinning is False else 'a device of unknown kind'} (queue/rotational)"


def choose_io_depth(path) -> Tuple[int, str]:
    """(reads in flight, reason) for read-ahead in ``path`` by default: 0 (``posix_fadvise(WILLNEED)``) where the
    kernel honours it, else the pool's depth; asked once per file system (device) and process."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return 0, "the data file cannot be examined: posix_fadvise(WILLNEED)"
    if dev not in _CHOSEN:
        honoured = willneed_honoured(path)
        if honoured is False:
            depth, why = choose_depth(path)
            _CHOSEN[dev] = depth, f"this file system ignores posix_fadvise(WILLNEED) (pages advised were not read), " \
                                  f"so the records ahead are read by {depth} threads at once: {why}"
        else:
            _CHOSEN[dev] = 0, (f"posix_fadvise(WILLNEED){' is honoured here and' if honoured else ''} queues each " \
                               f"top-up whole, deeper than threads reading and with no copy: {WILLNEED_WHY}; " \
                               f"io_depth=N reads with N threads")
    return _CHOSEN[dev]


_CHOSEN: dict = {}  # st_dev -> (depth, reason), once per device and process
