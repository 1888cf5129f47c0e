"""Read-ahead in the order the loader already knows: ``Hinter``.

The sampler fixes an epoch's order before the epoch starts, so while batch
``k`` is read, the kernel can already be reading the records of the batches
after it.  ``Hinter.follow(indices)`` yields the sampler's indices one by one
while a thread keeps the records of the next ``budget`` bytes of that order
requested from storage (``posix_fadvise(WILLNEED)`` on their byte ranges, or,
with ``depth``, read by that many threads at once: below):
whenever an eighth of the budget has been handed out, it tops the requests up
to the budget again, in file order with touching ranges merged (a
quasi-random order's consecutive records become longer reads).  Topping up in
small steps keeps the disk's queue fed: with refills of half the budget, the
reader waited for most of a refill (its records are anywhere in it) while no
new one was queued (0.55 GB cold, in process: 64-72% of the sequential rate
against 105-120% with eighths, same run).  The requests run in their own thread because the kernel
allocates the pages and queues the reads before the call returns (a third of
a cold epoch when the reader made them itself); the call releases the GIL.
Small files read for every record (labels, checksums) are requested whole at
the start of each epoch.  For a dataset larger than the page cache
(``drop_behind``), each top-up also drops the pages of records handed out
that many positions ago (``posix_fadvise(DONTNEED)``; only pages wholly
inside them): they would not be read again this epoch, and a cgroup at its
limit otherwise reclaims a page for every page it reads.

It runs where the sampler runs, the training process, and serves readers in
the same process and in workers alike: the page cache is shared.  The indices
handed out are the ones the DataLoader sends to readers, at most
``prefetch_factor`` batches per worker ahead of the training loop, so the
pages requested ahead of the training loop stay under ``budget`` plus the
batches in flight.  The thread starts on the epoch's first index, after the
DataLoader has started its workers, and stops when the epoch's indices run out
or the iteration is dropped.  It needs the byte ranges of records
(``record_extents()``: pixfeed's mmap, LMDB and HDF5 readers, and a mixture of
them, whose ``parts`` each get a thread for one source's file and a share of
the budget); other datasets are read without it.  ``active`` turns it off for an epoch (``epochplan.py``:
when every page of the dataset is in the page cache already).

Reads with depth (``depth`` > 0, ``make_loader(io_depth=N)``): each top-up's
ranges, sorted by offset and merged where they touch or lie within 32 KiB, cut
into reads of at most 1 MiB, go to a pool of ``depth`` threads
(``storage.depth.Reads``) doing ``os.preadv`` into one reusable buffer each
(the GIL released), so ``depth`` requests are in flight; the bytes land in the
page cache, which hands them to the readers (reading the records out of the
buffers instead would be a change to the readers).  Pieces of records handed
out more than ``drop_behind`` positions ago (else a budget's worth) are
skipped, the queue is dropped with the iteration, and a read that fails (a
file vanished or shrank) ends the pool quietly: the reader names the damage.
``depth`` 0 (WILLNEED) stays the default where the kernel honours it: it
queues a whole top-up at once without threads or copies, and measured ahead
of 16 threads in every cold row of ``bench_bigdata.py`` on the 2-CPU dev
machine (shuffled 1.67 against 1.28 GB/s); the pool serves file systems that
ignore the advice (``cacheplan.py``, ``storage/depth.py``).
"""
from __future__ import annotations

import os
import threading
from typing import Iterator, List, Optional

import numpy as np

from pixfeed.errors import PixfeedError
from pixfeed.loaders.order import as_ints
from pixfeed.storage.bounded import open_regular
from pixfeed.storage.depth import Reads
from pixfeed.storage.pagecache import Extents, dont_need, will_need

REFILLS = 8  # the budget is topped up in steps of 1/REFILLS of it


class Hinter:
    """Requests the next ``budget`` bytes of records in the order given to ``follow``; with
    ``drop_behind``, drops the pages of records that many positions behind the one handed out; with
    ``depth``, reads them with that many reads in flight (``storage.depth.Reads``), else (0) asks the kernel
    to (``posix_fadvise(WILLNEED)``)."""

    def __init__(self, extents: Extents, budget: int, drop_behind: Optional[int] = None, depth: int = 0) -> None:
        self.extents, self.budget, self.drop_behind, self.depth = extents, budget, drop_behind, depth
        self.active = True  # off for an epoch whose records are all in the page cache (epochplan.py)

    def follow(self, indices: np.ndarray) -> Iterator[int]:
        return self._requested(np.asarray(indices)) if self.active else as_ints(indices)

    def _requested(self, idx: np.ndarray) -> Iterator[int]:
        parts = getattr(self.extents, "parts", None) or [self.extents]  # a mixture: a file per source (pixfeed.mixing)
        total = sum(p.mean_length for p in parts) or 1.0
        requests = [_Requests(p, idx, int(self.budget * p.mean_length / total), self.drop_behind, self.depth)
                    for p in parts]
        for r in requests:
            r.start()
        try:
            for pos, index in enumerate(as_ints(idx)):
                for r in requests:
                    r.reached(pos)
                yield index
        finally:
            for r in requests:
                r.stop()


class _Requests(threading.Thread):
    """The thread that issues the requests, woken as the handed-out position moves.

    It keeps no per-record array of the epoch: ``extents.of`` gives the byte ranges of the positions it
    is about to request (a slice of the order), and ``ends`` holds the cumulative lengths of the
    positions requested and not yet handed out (``window`` below: at most the budget's records)."""

    def __init__(self, extents: Extents, idx: np.ndarray, budget: int, drop_behind: Optional[int],
                 depth: int = 0) -> None:
        super().__init__(name="pixfeed-io-ahead", daemon=True)
        self.extents, self.idx, self.budget, self.drop_behind = extents, idx, max(int(budget), 1), drop_behind
        self.depth, self.reads = depth, None  # the pool reading the requested ranges (depth > 0)
        self.position, self.hinted, self.dropped, self.stopped = 0, 0, 0, False
        self.wake_at = 0  # the reader wakes the thread when it reaches this position
        self.lo, self.ends = 0, np.zeros(0, np.int64)  # positions lo..hinted-1: cumulative lengths from lo
        self.wake = threading.Event()

    def reached(self, position: int) -> None:
        self.position = position
        if self.reads is not None:
            self.reads.position = position
        if position >= self.wake_at:
            self.wake.set()

    def stop(self) -> None:
        self.stopped = True
        self.wake.set()
        reads = self.reads
        if reads is not None:
            reads.stop()

    def run(self) -> None:
        try:
            _request_whole(self.extents.whole)
            fd = open_regular(self.extents.path)  # a FIFO swapped in is refused, never waited on
        except (OSError, PixfeedError):
            return  # nothing to request from: the reader names what is missing
        try:
            if self.depth:  # a piece stale by more than drop_behind positions would read dropped pages again
                lag = self.drop_behind if self.drop_behind is not None else \
                    int(self.budget / max(self.extents.mean_length, 1.0))
                self.reads = Reads(self.extents.path, self.depth, lag)
                if self.stopped:
                    self.reads.stop()
            while not self.stopped and self.hinted < len(self.idx):
                if self.position < self.wake_at:
                    self.wake.wait()
                    self.wake.clear()
                    continue
                self._top_up(fd, self.position)
                self._drop(fd, self.position)
        except (OSError, PixfeedError):
            pass  # hints are advice: a damaged or vanished record is the reader's to name, as it reads it
        finally:
            if self.reads is not None:
                if self.stopped:
                    self.reads.stop()
                self.reads.close()  # the pieces still queued are read first, unless the iteration was dropped
            os.close(fd)

    def _request(self, fd: int, starts: np.ndarray, lengths: np.ndarray, first: int) -> None:
        """Request the ranges of the positions from ``first`` on: read with depth, or advised."""
        if self.reads is not None:
            self.reads.add(starts, lengths, np.arange(first, first + len(starts)))
        else:
            will_need(fd, starts, lengths)

    def _top_up(self, fd: int, position: int) -> None:
        """Request records until those handed out from ``position`` on fill the budget (at least the one
        at ``position``), then set the position at which a top-up of an eighth of the budget is due."""
        if position >= self.hinted:  # the reader caught up: what it passed is requested as it goes
            starts, lengths = self.extents.of(self.idx[self.hinted:position])
            self._request(fd, starts, lengths, self.hinted)
            self.lo = self.hinted = position
            self.ends = np.zeros(0, np.int64)
        else:  # forget the positions handed out
            done = int(self.ends[position - self.lo - 1]) if position > self.lo else 0
            self.ends, self.lo = self.ends[position - self.lo:] - done, position
        ahead = int(self.ends[-1]) if len(self.ends) else 0
        mean = max(self.extents.mean_length, 1.0)
        while self.hinted < len(self.idx) and ahead < self.budget:
            count = min(len(self.idx) - self.hinted, int((self.budget - ahead) / mean * 1.25) + 1)
            starts, lengths = self.extents.of(self.idx[self.hinted:self.hinted + count])
            ends = ahead + np.cumsum(lengths)
            take = int(np.searchsorted(ends, self.budget, "right")) or int(self.hinted == position)
            if not take:
                break
            self._request(fd, starts[:take], lengths[:take], self.hinted)
            self.ends = np.concatenate([self.ends, ends[:take]])
            self.hinted += take
            ahead = int(ends[take - 1])
            if take < count:
                break
        due = int(np.searchsorted(self.ends, ahead - (self.budget - self.budget // REFILLS), "right")) + 1
        self.wake_at = max(min(self.lo + due, self.hinted), position + 1)

    def _drop(self, fd: int, position: int) -> None:
        if self.drop_behind is None or position - self.drop_behind <= self.dropped:
            return
        end = position - self.drop_behind
        dont_need(fd, *self.extents.of(self.idx[self.dropped:end]))
        self.dropped = end


def _request_whole(paths: List) -> None:
    for path in paths:
        fd = open_regular(path)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
