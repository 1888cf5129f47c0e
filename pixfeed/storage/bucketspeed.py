"""How fast a bucket answers: the figures ``pixfeed doctor URL`` advises from and ``pixfeed bench URL`` reports.

Three measurements on a dataset's data files (or any objects under the prefix),
each a few seconds at most:

* latency: the median of ``PINGS`` one-byte ranged GETs, one after another;
* one stream: a front-to-back read of the largest file, up to ``STREAM_LIMIT``
  bytes, as one WebDataset worker reads a shard;
* parallel: ``cache.PARALLEL`` ranged GETs of ``cache.CHUNK`` bytes in flight
  over up to ``read_limit`` bytes, as the local cache stages a dataset and the
  chunk cache fetches.
"""
from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Optional, Tuple

from pixfeed.storage import cache
from pixfeed.errors import PixfeedError
from pixfeed.manifest import read_manifest
from pixfeed.storage.store import Store

PINGS = 8
STREAM_LIMIT = 64 * 2**20


def measure(url: str, storage_options: Optional[dict], read_limit: int) -> Optional[Dict[str, float]]:
    """{latency_s, stream_bytes_per_s, parallel_bytes_per_s, parallel_bytes, bytes_per_record (None when
    the prefix is not a dataset)}, or None when there is nothing under ``url`` to read."""
    store = Store(url, storage_options)
    files, per_record = _files(store, storage_options)
    if not files:
        return None
    latency = statistics.median(_timed(lambda: store.read_range(name, 0, 1))[0]
                                for name in (list(files) * PINGS)[:PINGS])
    largest = max(files, key=files.get)
    seconds, streamed = _timed(lambda: _stream(store, largest, min(files[largest], STREAM_LIMIT)))
    many_seconds, fetched = _timed(lambda: _parallel(store, files, read_limit))
    return {"url": url, "latency_s": latency, "stream_bytes_per_s": streamed / seconds,
            "parallel_bytes_per_s": fetched / many_seconds, "parallel_bytes": fetched,
            "bytes_per_record": per_record}


def _files(store: Store, storage_options: Optional[dict]) -> Tuple[dict, Optional[float]]:
    """({name: bytes} to read, stored bytes per record or None when the prefix is not a dataset)."""
    try:
        manifest = read_manifest(store.url, storage_options)
    except PixfeedError:
        return store.list(), None
    files = {name: meta["bytes"] for name, meta in manifest["files"].items() if meta["bytes"]}
    return files, sum(files.values()) / max(1, manifest["count"])


def _timed(fn) -> Tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _stream(store: Store, name: str, limit: int) -> int:
    done = 0
    with store.open(name) as f:
        while done < limit and (block := f.read(1 << 20)):
            done += len(block)
    return done


def _parallel(store: Store, files: dict, limit: int) -> int:
    ranges, total = [], 0
    for name, n in files.items():
        for start in range(0, n, cache.CHUNK):
            if total >= limit:
                break
            ranges.append((name, start, min(start + cache.CHUNK, n)))
            total += ranges[-1][2] - start
    with ThreadPoolExecutor(cache.PARALLEL) as pool:
        return sum(len(b) for b in pool.map(lambda r: store.read_range(*r), ranges))
