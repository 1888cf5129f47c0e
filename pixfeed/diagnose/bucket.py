"""How fast a dataset in a bucket reads (``pixfeed doctor s3://...``).

The figures (GET latency, one stream, parallel GETs) are measured by
``pixfeed/storage/bucketspeed.py``; the advice follows what is there: for WebDataset
shards, how many to read at once (DataLoader workers x ranks) for the
parallel rate; for a map-style dataset, how long its copy into the node's
cache takes (it is read locally after that); for an image prefix, the rate a
pack reads it at; and what the bucket caps reading at in images/s.
"""
from __future__ import annotations

import math
from typing import Optional

from pixfeed.storage import bucketspeed, cache
from pixfeed.diagnose.finding import OK, WARN, Finding, size
from pixfeed.errors import PixfeedError
from pixfeed.manifest import read_manifest


def check_bucket(url: str, storage_options: Optional[dict], read_limit: int) -> Finding:
    speed = bucketspeed.measure(url, storage_options, read_limit)
    if speed is None:
        return Finding("storage", f"{url}: no objects to read", "point doctor at a dataset or an image prefix", WARN)
    latency, one, many = speed["latency_s"], speed["stream_bytes_per_s"], speed["parallel_bytes_per_s"]
    fetched, per_record = speed["parallel_bytes"], speed["bytes_per_record"]
    value = (f"{url}: GET latency {latency * 1e3:.0f} ms; one stream {one / 1e6:.0f} MB/s, "
             f"{cache.PARALLEL} parallel GETs {many / 1e6:.0f} MB/s ({size(fetched)} read)")
    manifest = _manifest(url, storage_options)
    if manifest is None:
        advice = [f"packing from this prefix reads its files {cache.PARALLEL} at a time, at up to "
                  f"{many / 1e6:.0f} MB/s"]
    elif manifest["format"] == "wds":
        streams = max(1, math.ceil(many / one)) if one else 1
        advice = [f"read at least {streams} shards at once (DataLoader workers x ranks) to reach the parallel rate"]
    else:
        stored = sum(meta["bytes"] for meta in manifest["files"].values())
        advice = [f"a {manifest['format']} dataset is copied to the node's cache when opened ({size(stored)}, about "
                  f"{stored / many:.0f} s at the parallel rate, once per node) and read locally from then on; "
                  "larger than the local disk: open it with cache_limit= (pixfeed doctor URL --cache-limit)"]
    if per_record:
        advice.append(f"the bucket caps reading at {many / per_record:.0f} images/s")
    return Finding("storage", value, "; ".join(advice), OK, speed)


def _manifest(url: str, storage_options: Optional[dict]) -> Optional[dict]:
    try:
        return read_manifest(url, storage_options)
    except PixfeedError:
        return None
