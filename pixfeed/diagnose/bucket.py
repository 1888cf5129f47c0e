"""How fast a dataset in a bucket reads (``pixfeed doctor s3://...``).

Three measurements on the dataset's data files (or any objects under the
prefix), each a few seconds at most:

* latency: the median of ``PINGS`` one-byte ranged GETs, one after another;
* one stream: a front-to-back read of the largest file, up to ``STREAM_LIMIT``
  bytes, as one WebDataset worker reads a shard;
* parallel: ``cache.PARALLEL`` ranged GETs of ``cache.CHUNK`` bytes in flight
  over up to ``read_limit`` bytes, as the local cache stages a dataset.

The advice: how many shards to read at once (DataLoader workers x ranks) for
the parallel rate, and what the bucket caps reading at in images/s.
"""
from __future__ import annotations

import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Tuple

from pixfeed import cache
from pixfeed.diagnose.finding import OK, WARN, Finding, size
from pixfeed.errors import PixfeedError
from pixfeed.manifest import read_manifest
from pixfeed.storage import Store

PINGS = 8
STREAM_LIMIT = 64 * 2**20


def check_bucket(url: str, storage_options: Optional[dict], read_limit: int) -> Finding:
    store = Store(url, storage_options)
    files, per_record = _files(store, storage_options)
    if not files:
        return Finding("storage", f"{url}: no objects to read", "point doctor at a dataset or an image prefix", WARN)
    latency = statistics.median(_timed(lambda: store.read_range(name, 0, 1))[0]
                                for name in (list(files) * PINGS)[:PINGS])
    largest = max(files, key=files.get)
    seconds, streamed = _timed(lambda: _stream(store, largest, min(files[largest], STREAM_LIMIT)))
    one = streamed / seconds
    seconds, fetched = _timed(lambda: _parallel(store, files, read_limit))
    many = fetched / seconds
    value = (f"{url}: GET latency {latency * 1e3:.0f} ms; one stream {one / 1e6:.0f} MB/s, "
             f"{cache.PARALLEL} parallel GETs {many / 1e6:.0f} MB/s ({size(fetched)} read)")
    streams = max(1, math.ceil(many / one)) if one else 1
    advice = [f"read at least {streams} shards at once (DataLoader workers x ranks) to reach the parallel rate"]
    if per_record:
        advice.append(f"the bucket caps reading at {many / per_record:.0f} images/s")
    data = {"url": url, "latency_s": latency, "stream_bytes_per_s": one, "parallel_bytes_per_s": many,
            "bytes_per_record": per_record}
    return Finding("storage", value, "; ".join(advice), OK, data)


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
