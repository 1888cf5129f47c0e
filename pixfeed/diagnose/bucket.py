"""How fast a dataset in a bucket reads (``pixfeed doctor s3://...``).

The figures (GET latency, one stream, parallel GETs) are measured by
``pixfeed/bucketspeed.py``; the advice: how many shards to read at once
(DataLoader workers x ranks) for the parallel rate, and what the bucket caps
reading at in images/s.
"""
from __future__ import annotations

import math
from typing import Optional

from pixfeed import bucketspeed, cache
from pixfeed.diagnose.finding import OK, WARN, Finding, size


def check_bucket(url: str, storage_options: Optional[dict], read_limit: int) -> Finding:
    speed = bucketspeed.measure(url, storage_options, read_limit)
    if speed is None:
        return Finding("storage", f"{url}: no objects to read", "point doctor at a dataset or an image prefix", WARN)
    latency, one, many = speed["latency_s"], speed["stream_bytes_per_s"], speed["parallel_bytes_per_s"]
    fetched, per_record = speed["parallel_bytes"], speed["bytes_per_record"]
    value = (f"{url}: GET latency {latency * 1e3:.0f} ms; one stream {one / 1e6:.0f} MB/s, "
             f"{cache.PARALLEL} parallel GETs {many / 1e6:.0f} MB/s ({size(fetched)} read)")
    streams = max(1, math.ceil(many / one)) if one else 1
    advice = [f"read at least {streams} shards at once (DataLoader workers x ranks) to reach the parallel rate"]
    if per_record:
        advice.append(f"the bucket caps reading at {many / per_record:.0f} images/s")
    return Finding("storage", value, "; ".join(advice), OK, speed)
