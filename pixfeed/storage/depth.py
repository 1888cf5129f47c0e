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

The depth: ``choose_depth`` measures, once per device and process, how many
random reads the storage under a file completes at depths 1, 4 and 16
(``measure_depths``: ``O_DIRECT`` reads of ``PROBE_BYTES`` at random aligned
offsets, so the page cache is neither used nor disturbed; at most
``PROBE_SECONDS`` a depth) and keeps the smallest depth within 15% of the best
rate.  Where it cannot be measured (a file too small, a file system without
``O_DIRECT`` such as tmpfs) the device's ``queue/rotational`` flag decides:
``ROTATIONAL_DEPTH`` for a spinning disk, else ``SOLID_DEPTH`` (virtual disks
often say rotational when they are not, hence the measurement first).

``sequential_rate`` reads files in order with ``depth`` reads in flight: the
reference a cold epoch is compared with (one stream, ``pagecache.read_rate``,
gets a fraction of what a device with a deep queue gives).  ``ranges_rate``
reads given ranges the same way: a sample of an epoch's records.
"""
from __future__ import annotations

import collections
import mmap
import os
import threading
import time
from typing import Callable, Iterable, List, Optional, Tuple

import numpy as np

from .bounded import open_regular

PIECE = 1 << 20  # bytes of one read (each thread's buffer)
NEAR = 32 << 10  # ranges closer than this are read as one (the gap read with them: less than one request costs)
SOLID_DEPTH = 16  # reads in flight on an SSD/NVMe device when it cannot be measured
ROTATIONAL_DEPTH = 2  # on a spinning disk: more requests only make its head seek between them
DEPTHS = (1, 4, 16)  # depths measured by choose_depth
PROBE_BYTES = 128 << 10  # one measured read
PROBE_SECONDS = 0.05  # at most this long (plus one read per thread) at each depth, once per device and process
PROBE_READS = 64  # and at most this many reads at each depth
WITHIN = 0.85  # the smallest depth reaching this fraction of the best measured rate is chosen

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
        self._queue: collections.deque = collections.deque()  # arrays of rows (offset, length, tag)
        self._busy = 0
        self._lock = threading.Condition()
        self._threads = [threading.Thread(target=self._work, name="pixfeed-io-depth", daemon=True)
                         for _ in range(self.depth)]
        self._closing = False
        for thread in self._threads:
            thread.start()

    def add(self, starts: np.ndarray, lengths: np.ndarray, tags: Optional[np.ndarray] = None) -> None:
        """Queue the ranges (coalesced, in file order) to be read."""
        rows = pieces(*coalesce(starts, lengths, tags, self.near), piece=self.piece)
        if len(rows):
            with self._lock:
                if self.stopped:  # stopped or failed: nothing more is read
                    return
                self._queue.append(rows)
                self._lock.notify(min(len(rows), self.depth))

    def _next(self) -> Optional[tuple]:
        with self._lock:
            while True:
                if self.stopped:
                    return None
                while self._queue:
                    rows = self._queue[0]
                    if len(rows) == 1:
                        self._queue.popleft()
                    else:
                        self._queue[0] = rows[1:]
                    offset, length, tag = (int(x) for x in rows[0])
                    if tag >= self.position - self.lag:
                        self._busy += 1
                        return offset, length
                if self._closing:
                    return None
                self._lock.wait()

    def _work(self) -> None:
        buffer = mmap.mmap(-1, self.piece)  # anonymous: page-aligned, untouched until read into
        view = memoryview(buffer)
        try:
            while True:
                job = self._next()
                if job is None:
                    return
                offset, length = job
                try:
                    got = self.read(self.fd, [view[:length]], offset)
                except OSError as e:  # advice only: the reader names a file that vanished or shrank
                    got, self.failed = 0, e
                    self.stop()
                with self._lock:
                    self._busy -= 1
                    self.reads += 1
                    self.bytes += got
                    self._lock.notify_all()
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
                self._lock.wait(left)
            return True

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            self._queue.clear()
            self._lock.notify_all()

    def close(self) -> None:
        """Read what is queued (nothing once stopped), end the threads, close the descriptor."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        for thread in self._threads:
            thread.join()
        os.close(self.fd)


def sequential_rate(files: List, depth: int, piece: int = PIECE) -> dict:
    """Bytes/s of reading ``files`` once in order, ``depth`` reads of ``piece`` bytes in flight (through the page
    cache: evict the files first for a cold read)."""
    start, total = time.perf_counter(), 0
    for path in files:
        size = os.stat(path).st_size
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


def measure_depths(path, depths: Iterable[int] = DEPTHS, seconds: float = PROBE_SECONDS,
                   reads: int = PROBE_READS, size: int = PROBE_BYTES) -> Optional[dict]:
    """{depth: bytes/s} of ``O_DIRECT`` reads of ``size`` bytes at random aligned offsets of ``path`` (bypassing
    the page cache), each depth for at most ``seconds`` or ``reads`` reads; None where it cannot be measured (a
    file smaller than 16 reads, no ``O_DIRECT``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_NONBLOCK)
    except (OSError, AttributeError):
        return None
    try:
        blocks = os.fstat(fd).st_size // size
        if blocks < 16:
            return None
        rng = np.random.default_rng(blocks)
        return {d: _direct_rate(fd, d, rng.integers(0, blocks, reads) * size, size, seconds) for d in depths}
    except OSError:
        return None
    finally:
        os.close(fd)


def _direct_rate(fd: int, depth: int, offsets: np.ndarray, size: int, seconds: float) -> float:
    todo = iter(offsets.tolist())
    lock, done = threading.Lock(), [0]
    stop_at = time.perf_counter() + seconds
    errors: list = []

    def work() -> None:
        buffer = mmap.mmap(-1, size)
        try:
            while time.perf_counter() < stop_at:
                with lock:
                    offset = next(todo, None)
                if offset is None:
                    return
                n = os.preadv(fd, [buffer], offset)
                with lock:
                    done[0] += n
        except OSError as e:
            errors.append(e)
        finally:
            buffer.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=work, daemon=True) for _ in range(depth)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return done[0] / max(time.perf_counter() - start, 1e-9)


def pick(rates: dict) -> int:
    """The smallest measured depth within ``WITHIN`` of the best rate."""
    best = max(rates.values())
    return min(d for d, r in rates.items() if r >= WITHIN * best)


def choose_depth(path) -> Tuple[int, str]:
    """(depth, reason) for reads ahead in ``path``: measured once per device and process, else from the device."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return SOLID_DEPTH, "the file cannot be examined: the default for SSDs"
    if dev not in _CHOSEN:
        _CHOSEN[dev] = _choose(path)
    return _CHOSEN[dev]


_CHOSEN: dict = {}  # st_dev -> (depth, reason): measured once per device and process


def _choose(path) -> Tuple[int, str]:
    rates = measure_depths(path)
    if rates:
        depth = pick(rates)
        measured = ", ".join(f"{d}: {r / 1e6:.0f}" for d, r in rates.items())
        return depth, f"the smallest depth within {WITHIN:.0%} of the best random-read rate measured on this " \
                      f"device (MB/s at depth {measured})"
    spinning = rotational(path)
    if spinning:
        return ROTATIONAL_DEPTH, "a rotational disk (queue/rotational), not measured: few reads in flight"
    return SOLID_DEPTH, f"{'an SSD' if spinning is False else 'an unknown device'} (not measured: no O_DIRECT or " \
                        f"a small file): the default for SSDs"
