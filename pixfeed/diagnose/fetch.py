"""The fetch plan of a bucket dataset read through a chunk cache (``pixfeed doctor URL --cache-limit 200GB``).

Opens the dataset as training would (``cache_limit``: small files staged, the
data file read through chunks, ``pixfeed.storage.chunked``) and builds the loaders of a
full shuffle and of ``order="quasi_random"``; each plan's forecast
(``loaders/fetchplan.py``) says the bytes epoch 0 fetches.  No epoch is read.
"""
from __future__ import annotations

from typing import Optional

from pixfeed.diagnose.finding import INFO, OK, WARN, Finding, size


def check_fetch(url: str, storage_options: Optional[dict], cache_limit, batch_size: int,
                image_size=None) -> Finding:
    from pixfeed.storage.chunked import data_file, parse_bytes
    from pixfeed.datasets import open_dataset
    from pixfeed.loaders import make_loader
    from pixfeed.manifest import read_manifest

    manifest = read_manifest(url, storage_options)
    total = sum(meta["bytes"] for meta in manifest["files"].values())
    if data_file(manifest) is None or total <= parse_bytes(cache_limit):
        return Finding("fetch plan", f"{url}: {size(total)} staged whole (it fits in cache_limit, or its format is "
                       "read whole: LMDB, wds streams)", "the first epoch waits for the copy; no fetching after it", INFO)
    ds = open_dataset(url, storage_options=storage_options, cache_limit=cache_limit, size=image_size)
    plans = {order: make_loader(ds, batch_size, order=order, num_workers=0).pixfeed_plan.fetch
             for order in ("random", "quasi_random")}
    ratio = {order: f["epoch_bytes"] / max(f["data_bytes"], 1) for order, f in plans.items()}
    f = plans["random"]
    value = (f"{f['chunks']} chunks of {size(f['chunk_bytes'])}, {f['capacity']} in cache_limit; an epoch fetches "
             f"{size(f['epoch_bytes'])} ({ratio['random']:.2f}x) in a full shuffle, "
             f"{size(plans['quasi_random']['epoch_bytes'])} ({ratio['quasi_random']:.2f}x) with order='quasi_random'")
    if ratio["random"] <= 1.5:
        return Finding("fetch plan", value, "a full shuffle fetches little more than the data", OK, plans)
    return Finding("fetch plan", value, "use make_loader(..., order='quasi_random'), or a smaller chunk_bytes or a "
                   "larger cache_limit for a full shuffle", WARN, plans)
