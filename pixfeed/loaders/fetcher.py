"""Fetching a chunk-cached dataset's chunks in the sampler's order: ``Fetcher`` and ``attach``.

For a dataset read through a chunk cache (``pixfeed.storage.chunked``), the sampler's
``hints`` is a ``Fetcher`` instead of the page-cache ``Hinter``: as it hands
out this rank's indices, a thread keeps the chunks of the next ``ahead`` bytes
of records (at most half of the chunks ``cache_limit`` holds) requested, in
order of first use, ``PARALLEL`` GETs at a time, so that readers (in this
process or in workers) find their chunk present; a reader whose chunk is not
there yet waits for its GET (or makes it) under the chunk's lock.

Eviction: the epoch's whole order is known (every rank's: ``ResumableSampler``
deals one stream out), so ``Uses`` gives each chunk's next use in that stream,
and room is made by evicting the chunk used furthest ahead (Belady's optimal
policy), never one needed before the chunk being fetched.  Chunks no record
covers (HDF5 metadata, a ``.npy`` header) are evicted last.  A resumed epoch's
stream starts at the resume point, so it fetches only what is left.

``attach`` wires it into a loader and reports in ``loader.pixfeed_plan``'s
``storage`` row (and ``plan.fetch``) the regime and the bytes the epoch will
fetch, from simulating that policy over the order (``forecast``).  With
``order="quasi_random"`` the order's chunks are ``QUASI_CHUNKS`` cache chunks
of records, so an epoch fetches each cache chunk about once.
"""
from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, List

import numpy as np

from pixfeed.storage.chunkcache import ChunkCache
from pixfeed.loaders.order import as_ints
from pixfeed.storage.pagecache import Extents

PARALLEL = 8      # chunk GETs in flight
QUASI_CHUNKS = 4  # cache chunks per quasi-random chunk (their edges do not align: ~1/4 fetched twice)


def record_chunks(cache: ChunkCache, extents: Extents, records: np.ndarray) -> tuple:
    """(positions, chunks): every chunk each record of ``records`` covers, by the record's position, in order;
    none for a length of 0 (a mixture's index of another source, ``pixfeed.mixing.extents``)."""
    starts, lengths = extents.of(records)
    first, last = starts // cache.chunk, (starts + np.maximum(lengths, 1) - 1) // cache.chunk
    counts = np.where(lengths > 0, last - first + 1, 0)
    positions = np.repeat(np.arange(len(records)), counts)
    return positions, np.repeat(first, counts) + np.arange(len(positions)) - np.repeat(np.cumsum(counts) - counts, counts)


class Uses:
    """When each chunk is used in a stream of records (time = position in the stream)."""

    def __init__(self, cache: ChunkCache, extents: Extents, stream: np.ndarray) -> None:
        times, ids = record_chunks(cache, extents, stream)
        order = np.lexsort((times, ids))
        self.ids, self.times = ids[order], times[order]
        self.bounds = np.searchsorted(self.ids, np.arange(cache.count + 1))

    def next_use(self, k: int, now: int) -> float:
        """The first use of chunk ``k`` at or after ``now``: inf when none is left, -1 for a chunk no record uses."""
        lo, hi = self.bounds[k], self.bounds[k + 1]
        if lo == hi:
            return -1.0
        j = lo + int(np.searchsorted(self.times[lo:hi], now))
        return float(self.times[j]) if j < hi else math.inf

    def sequence(self) -> np.ndarray:
        """The chunks in order of use, runs of one chunk collapsed."""
        seq = self.ids[np.argsort(self.times, kind="stable")]
        return seq[np.r_[True, seq[1:] != seq[:-1]]] if len(seq) else seq


class Fetcher:
    """``sampler.hints`` for a chunk-cached dataset: ``follow`` yields the indices and fetches ahead."""

    def __init__(self, cache: ChunkCache, extents: Extents, sampler: Any, ahead: int, lag: int) -> None:
        self.cache, self.extents, self.sampler, self.ahead, self.lag = cache, extents, sampler, ahead, lag

    def stream(self) -> np.ndarray:
        s = self.sampler
        order = np.asarray(s.epoch_order(), dtype=np.int64)
        return order[np.arange(s.offset, s.end) % len(order)] if len(order) else order

    def follow(self, indices: np.ndarray) -> Iterator[int]:
        own = np.asarray(indices, dtype=np.int64)
        walk = _Walk(self, Uses(self.cache, self.extents, self.stream()), own)
        walk.start()
        try:
            for pos, index in enumerate(as_ints(own)):
                walk.reached(pos)
                yield index
        finally:
            walk.stop()


class _Walk(threading.Thread):
    """Keeps the chunks of the records ahead of the handed-out position requested."""

    def __init__(self, fetcher: Fetcher, uses: Uses, own: np.ndarray) -> None:
        super().__init__(name="pixfeed-fetch-ahead", daemon=True)
        self.f, self.uses, self.cache = fetcher, uses, fetcher.cache
        self.pos, self.ids = record_chunks(self.cache, fetcher.extents, own)
        self.ends = np.cumsum(fetcher.extents.of(own)[1])
        world, rank = fetcher.sampler.num_replicas, fetcher.sampler.rank
        self.times = rank + world * np.arange(len(own))
        self.max_chunks = max(1, self.cache.limit // self.cache.chunk * 3 // 4)
        self.position, self.walked, self.stopped, self.wake = 0, -1, False, threading.Event()
        self.inflight: set = set()
        self.lock = threading.Lock()

    def reached(self, pos: int) -> None:
        self.position = pos
        if pos - self.walked >= max(1, min(self.max_chunks // 8, 256)):  # a walk per step, not per index
            self.wake.set()

    def stop(self) -> None:
        self.stopped = True
        self.cache.policy = None  # a worker forked later must not evict by this epoch's stale position
        self.wake.set()

    def reading(self) -> int:
        """The position readers are at: the handed-out one less the records handed out but not read yet."""
        return max(0, self.position - self.f.lag)

    def now(self) -> int:
        pos = self.reading()
        return int(self.times[pos]) if pos < len(self.times) else int(self.times[-1]) + 1

    def window(self) -> List[int]:
        """Chunks of the records from the readers' position to ``ahead`` bytes past the handed-out one."""
        start, pos = self.reading(), self.position
        done = int(self.ends[pos - 1]) if pos else 0
        stop = max(int(np.searchsorted(self.ends, done + self.f.ahead, "right")), pos + 1)
        ids = self.ids[np.searchsorted(self.pos, start):np.searchsorted(self.pos, stop)]
        _, where = np.unique(ids, return_index=True)
        return ids[np.sort(where)][:self.max_chunks].tolist()

    def run(self) -> None:
        self.cache.policy = self.victims  # readers of this process evict in the same order
        with ThreadPoolExecutor(PARALLEL, thread_name_prefix="pixfeed-fetch") as pool:
            while not self.stopped and self.position < len(self.ends):
                self.walked = self.position
                for k in self.window():
                    with self.lock:
                        if k in self.inflight or self.cache.path(k).exists():
                            continue
                        self.inflight.add(k)
                    pool.submit(self._fetch, k)
                self.wake.wait()
                self.wake.clear()

    def victims(self, present: List[int]) -> List[int]:
        """Present chunks, furthest next use first; chunks no record uses last."""
        now = self.now()
        keyed = [(self.uses.next_use(v, now), v) for v in present]
        return [v for key, v in sorted(keyed, key=lambda kv: (kv[0] < 0, -kv[0]))]

    def _fetch(self, k: int) -> None:
        now = self.now()
        need = self.uses.next_use(k, now)
        try:
            self.cache.fetch(k, self.victims, lambda v: self.uses.next_use(v, now) > need)
        except Exception:  # noqa: BLE001 - the reader that needs the chunk fetches it itself and raises
            self.cache.stats["fetcher_errors"] += 1
        finally:
            with self.lock:
                self.inflight.discard(k)
            self.wake.set()
