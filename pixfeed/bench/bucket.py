"""``pixfeed bench URL``: a packed dataset in a bucket, read as training reads it.

Three parts, measured in one run so they can be compared:

* the bucket: GET latency, one stream and parallel GETs (``bucketspeed``);
* the loader's plan: ``storage`` (the dataset staged whole into the node's
  cache, or read through a chunk cache of ``cache_limit``) and, for a chunk
  cache, the regime and the bytes epoch 0 fetches (``plan.fetch``);
* ``epochs`` epochs through ``make_loader``: the first batch after opening,
  images/s, and the stored bytes read per second against the parallel GET
  rate (how much of the bucket's throughput the loader turns into training
  data).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from ..storage.bucketspeed import measure
from ..console.texttable import table

READ_LIMIT = 256 * 2**20


def bench_url(url: str, out: Path, *, storage_options: Optional[dict], cache_limit, size, batch_size: int,
              epochs: int, workers, order: str) -> dict:
    from ..datasets import open_dataset
    from ..loaders import make_loader
    from ..manifest import read_manifest

    manifest = read_manifest(url, storage_options)
    stored = sum(meta["bytes"] for meta in manifest["files"].values())
    speed = measure(url, storage_options, READ_LIMIT)
    start = time.perf_counter()
    if size is None and manifest.get("store") != "pixels":
        size = 224  # encoded images of any size: center crop, as the folder bench reads them
    ds = open_dataset(url, storage_options=storage_options, cache_limit=cache_limit, size=size)
    loader = make_loader(ds, batch_size, num_workers=workers, order=order)
    plan = loader.pixfeed_plan
    rows, first_batch = [], None
    for epoch in range(epochs):
        images, t0 = 0, time.perf_counter()
        for batch in loader:
            images += len(batch[0])
            first_batch = first_batch or time.perf_counter() - start
        seconds = time.perf_counter() - t0
        rows.append({"epoch": epoch, "images": images, "seconds": round(seconds, 3),
                     "images_per_s": round(images / seconds, 1),
                     "stored_mb_per_s": round(stored * images / max(len(ds), 1) / seconds / 1e6, 1)})
    result = {"url": url, "format": manifest["format"], "store": manifest.get("store"), "records": len(ds),
              "stored_bytes": stored, "bucket": speed, "storage": plan.storage, "fetch": plan.fetch,
              "first_batch_s": round(first_batch or 0.0, 3), "epochs": rows,
              "storage_reason": plan.reasons.get("storage", ""), "plan": str(plan)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def render(result: dict) -> str:
    speed, fetch = result["bucket"], result["fetch"]
    lines = [f"{result['url']}: {result['format']}/{result['store']}, {result['records']} records, "
             f"{result['stored_bytes'] / 1e6:.1f} MB stored"]
    if speed:
        lines.append(f"bucket: GET latency {speed['latency_s'] * 1e3:.0f} ms; one stream "
                     f"{speed['stream_bytes_per_s'] / 1e6:.0f} MB/s; parallel GETs "
                     f"{speed['parallel_bytes_per_s'] / 1e6:.0f} MB/s")
    lines.append(f"storage: {result['storage']} ({result['storage_reason']})")
    if fetch:
        lines.append(f"fetch plan: {fetch['regime']}; epoch 0 fetches {fetch['epoch_bytes'] / 2**20:.0f} MiB "
                     f"({fetch['epoch_bytes'] / max(fetch['data_bytes'], 1):.2f}x the data file)")
    else:
        lines.append("no chunk cache: " + ("shards streamed" if result["format"] == "wds" else
                                          "copied whole into the node's cache when opened (no --cache-limit, "
                                          "the dataset fits in it, or LMDB)"))
    lines.append(f"first batch {result['first_batch_s']:.2f} s after open_dataset")
    parallel = speed["parallel_bytes_per_s"] / 1e6 if speed else 0.0
    body = [[r["epoch"], r["images"], f"{r['images_per_s']:.0f}", f"{r['stored_mb_per_s']:.1f}",
             f"{r['stored_mb_per_s'] / parallel:.0%}" if parallel else "-"] for r in result["epochs"]]
    lines += table(["epoch", "images", "images/s", "stored MB/s", "of parallel GETs"], body)
    return "\n".join(lines)
