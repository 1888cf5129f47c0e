"""The fetch plan of a chunk-cached dataset: ``attach`` a ``Fetcher`` to a loader and say what an epoch fetches.

``attach(loader, dataset, extents)`` (from ``make_loader``) replaces the
sampler's page-cache hints with a ``fetcher.Fetcher`` when the dataset reads
its data file through a chunk cache, and fills ``plan.storage = "bucket
chunks"``, its reason and ``plan.fetch`` (regime, chunk bytes, chunks, chunks
the limit holds, and the bytes this epoch will fetch on the node: the GETs of
furthest-next-use eviction simulated over the epoch's order of every rank,
``belady``).  ``order="auto"`` (the default) becomes ``"quasi_random"`` here,
for a shuffled read: a full shuffle of a dataset larger than its cache fetches
most chunks again and again (1.5x to many times the data file an epoch, as the
cache is small against it), quasi-random each about once; the reason gives
both forecasts, and ``order="random"`` keeps the full shuffle.  Regimes: ``order="quasi_random"`` reads ``QUASI_CHUNKS`` cache
chunks of consecutive records at a time (windows of up to 32 of them, sized to
a tenth of the cache), so each chunk is fetched about once; a full shuffle
touches chunks all over the file, and the eviction policy decides how often
each comes back; ``shuffle=False`` reads the file once, in order.
"""
from __future__ import annotations

import heapq
from typing import Any, Optional

import numpy as np

from pixfeed.loaders.cacheplan import mib
from pixfeed.loaders.fetcher import QUASI_CHUNKS, Fetcher, Uses
from pixfeed.loaders.sampler import ResumableSampler
from pixfeed.storage.pagecache import Extents

DEFAULT_AHEAD = 256 << 20  # bytes of records fetched ahead when io_ahead is left to the page-cache rule


def belady(seq: np.ndarray, capacity: int) -> int:
    """GETs for ``seq`` with ``capacity`` chunks and furthest-next-use eviction."""
    n = len(seq)
    nxt = np.full(n, n, np.int64)
    order = np.argsort(seq, kind="stable")
    same = seq[order][1:] == seq[order][:-1]
    nxt[order[:-1][same]] = order[1:][same]
    cached, heap, gets = {}, [], 0
    for c, nu in zip(seq.tolist(), nxt.tolist()):
        if c not in cached:
            gets += 1
            while len(cached) >= capacity:
                key, victim = heapq.heappop(heap)
                if cached.get(victim) == -key:
                    del cached[victim]
        cached[c] = nu
        heapq.heappush(heap, (-nu, c))
    return gets


def quasi_sizes(cache: Any, extents: Extents) -> tuple:
    """(chunk, window) in records for quasi-random order over a chunk cache."""
    per_chunk = max(1, int(cache.chunk // max(extents.mean_length, 1.0)))
    capacity = cache.limit // cache.chunk
    chunk = per_chunk * QUASI_CHUNKS
    return chunk, chunk * max(1, min(32, capacity // 10))


def forecast(fetcher: Fetcher) -> dict:
    cache = fetcher.cache
    capacity = max(1, cache.limit // cache.chunk)
    gets = belady(Uses(cache, fetcher.extents, fetcher.stream()).sequence(), capacity)
    return {"chunk_bytes": cache.chunk, "chunks": cache.count, "capacity": capacity,
            "epoch_bytes": gets * cache.chunk, "data_bytes": cache.size}


def attach(loader: Any, dataset: Any, extents: Optional[Extents]) -> None:
    """Fetch a chunk-cached dataset's chunks in the loader's order (a no-op for other datasets)."""
    cache, sampler, plan = getattr(dataset, "chunks", None), loader.sampler, loader.pixfeed_plan
    if callable(getattr(dataset, "chunked_parts", None)) and isinstance(sampler, ResumableSampler):
        return _attach_parts(loader, dataset.chunked_parts())
    if cache is None or extents is None or not isinstance(sampler, ResumableSampler):
        return
    full_shuffle = None
    if getattr(plan, "order_asked", None) == "auto" and plan.order == "random" and sampler.shuffle:
        sampler._resize()
        full_shuffle = forecast(Fetcher(cache, extents, sampler, plan.io_ahead or DEFAULT_AHEAD, 0))
        plan.order = "quasi_random"
    if plan.order == "quasi_random":
        sampler.quasi = plan.quasi = quasi_sizes(cache, extents)
        plan.reasons["order"] = (f"shuffled chunks of {plan.quasi[0]} consecutive records ({QUASI_CHUNKS} cache "
                                 f"chunks), shuffled within windows of {plan.quasi[1]} records")
    sampler.hints = Fetcher(cache, extents, sampler, plan.io_ahead or DEFAULT_AHEAD, _lag(loader))
    sampler._resize()
    plan.fetch = {"regime": regime(plan, sampler), **forecast(sampler.hints)}
    plan.storage = "bucket chunks"
    f = plan.fetch
    if full_shuffle is not None:
        plan.reasons["order"] = (f"order='auto': the dataset ({mib(f['data_bytes'])}) is larger than its chunk cache "
                                 f"({f['capacity']} chunks of {mib(f['chunk_bytes'])}), so quasi-random: "
                                 f"{plan.reasons['order']}; this epoch fetches {mib(f['epoch_bytes'])} "
                                 f"({f['epoch_bytes'] / max(f['data_bytes'], 1):.2f}x the data file) where a full "
                                 f"shuffle would fetch {mib(full_shuffle['epoch_bytes'])} "
                                 f"({full_shuffle['epoch_bytes'] / max(f['data_bytes'], 1):.2f}x); order='random' "
                                 "for the full shuffle")
    plan.reasons["storage"] = (
        f"dataset > cache_limit: {f['chunks']} chunks of {mib(f['chunk_bytes'])}, {f['capacity']} fit; "
        f"{f['regime']}; epoch {loader.epoch} fetches {mib(f['epoch_bytes'])} "
        f"({f['epoch_bytes'] / max(f['data_bytes'], 1):.2f}x the data file; furthest-next-use eviction)"
        + crowded(sampler.hints.lag, f["capacity"], plan.order))


def _lag(loader: Any) -> int:
    """Records handed out by the sampler but not read yet: the batches the DataLoader may hold in flight."""
    plan = loader.pixfeed_plan
    return (plan.num_workers * (plan.prefetch_factor or 0) if plan.num_workers else 1) * loader.batch_size


def _attach_parts(loader: Any, parts: list) -> None:
    """A mixture (``pixfeed.mix``): each source read through a chunk cache fetched ahead in the mixture's order,
    beside the read-ahead of its local sources (``parts``: (cache, extents of the mixture's indices))."""
    plan, sampler = loader.pixfeed_plan, loader.sampler
    if not parts or (plan.io_ahead == 0 and plan.reasons.get("io_ahead") == "set by caller"):
        return
    larger = [(cache, e) for cache, e in parts if cache.size > cache.limit]
    if larger and getattr(plan, "order_asked", None) == "auto" and plan.order == "random" and sampler.shuffle:
        sampler.quasi = plan.quasi = min(quasi_sizes(cache, e.inner) for cache, e in larger)  # as the source alone
        plan.order = "quasi_random"
        plan.reasons["order"] = (f"order='auto': a source in a bucket is larger than its chunk cache, so quasi-random "
                                 f"as it is alone: shuffled chunks of {plan.quasi[0]} consecutive indices (one "
                                 f"source's records in file order), shuffled within windows of {plan.quasi[1]}; "
                                 "order='random' for the full shuffle")
    fetchers = [Fetcher(cache, extents, sampler, plan.io_ahead or DEFAULT_AHEAD, _lag(loader)) for cache, extents in parts]
    sampler.hints = Together([h for h in (sampler.hints, *fetchers) if h is not None])
    plan.reasons["storage"] += (f"; {len(parts)} source(s) read through a bucket's chunk cache, their chunks fetched "
                                "ahead in the mixture's order")


class Together:
    """Several hints following one order: a mixture's local read-ahead and a ``Fetcher`` per bucket source."""

    def __init__(self, hints: list) -> None:
        self.hints = hints

    def follow(self, indices: np.ndarray):
        walks = [h.follow(indices) for h in self.hints]
        try:
            for index, *_ in zip(*walks):
                yield index
        finally:
            for walk in walks:
                walk.close()


def crowded(records: int, capacity: int, order: str) -> str:
    """A warning when the records handed out but not yet read may need more chunks than the cache holds
    (the forecast assumes reads one at a time; a shuffle's in-flight records lie in as many chunks)."""
    if order == "quasi_random" or records <= capacity // 2:
        return ""
    return (f"; but the {records} records in flight may need more chunks than the {capacity} the cache holds, "
            "so chunks come back more often than that: raise cache_limit, lower chunk_bytes, prefetch_factor "
            "or batch_size, or use order='quasi_random'")


def regime(plan: Any, sampler: Any) -> str:
    if plan.order == "quasi_random":
        return "quasi_random: each chunk fetched about once"
    if not sampler.shuffle:
        return "record order: the file read once, in order"
    return "full shuffle: the eviction policy decides how often a chunk comes back"
