"""Cost of mixing: a mixture of two mmap pixel packs against one of them alone, per sample, in one run.

    python benchmarks/bench_mix.py                     # 2 packs of 2,000 stored 256x256 images, read at 224
    python benchmarks/bench_mix.py --size 0            # read at the stored size (no crop)
    python benchmarks/bench_mix.py --weights 3 1       # a weighted mixture (epoch of as many samples)
    python benchmarks/bench_mix.py --reads 400         # also: get_batch alone, without the loader
    python benchmarks/bench_mix.py --format wds --side 64 --size 0   # WebDataset packs (interleaved streams)
    python benchmarks/bench_mix.py --bucket --count 500 # first batch: a bucket pack alone vs mixed with a local one

Both are read through ``make_loader`` (in process, as the plan chooses for stored pixels) after a warm-up
epoch, alternating, ``--reps`` epochs each; the ratios of the medians and of the best epochs' seconds per
sample are the cost of mixing (goal: at most 1.05), by the wall clock and by this process's CPU time (which
other jobs on a shared machine disturb less).  A mixture reads each batch with one ``get_batch`` per source,
each source's records in file order, straight into its rows of one batch array.  ``--reads N``: the CPU
time of N batches read by ``get_batch`` alone (random indices, no loader), one pack against the mixture.
``--bucket``: pack ``b`` in a SeaweedFS bucket on 127.0.0.1 (started here, as the tests do), read through a
chunk cache of a third of its size (4 MiB chunks, a fresh cache each time); the seconds to the first batch of
``b`` alone against the mixture of local ``a`` and ``b``, alternating, median (goal: at most 1.0).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import pixfeed
from pixfeed.packers import pack_samples


def make_pack(path, count: int, seed: int, fmt: str = "mmap", side: int = 256, **options) -> None:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (16, side, side, 3), dtype=np.uint8)  # a few distinct images, cheap to make
    shards = {"shard_size": 100} if fmt == "wds" else {}
    pack_samples(({"image": base[i % 16], "label": f"c{i % 10}"} for i in range(count)), path, fmt,
                 store="pixels", workers=1, progress=False, **shards, **options)


def first_batches(root: Path, args) -> None:
    """Seconds to the first batch: a bucket pack alone against a mixture of a local pack and it (``--bucket``)."""
    import shutil
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from s3server import S3Server

    server = S3Server(root / "weed").start()
    try:
        so, url = server.options, server.bucket("mix") + "/b"
        make_pack(root / "a", args.count, 0, "mmap", args.side)
        make_pack(url, args.count, 1, "mmap", args.side, storage_options=so)
        options = {"size": args.size} if args.size else {}
        local = pixfeed.open_dataset(root / "a", **options)
        times = {"bucket alone": [], "mixture": []}
        for rep in range(args.reps):
            for name in times:
                cache = root / f"cache-{rep}-{len(times[name])}-{name[0]}"
                remote = pixfeed.open_dataset(url, storage_options=so, cache_dir=cache, chunk_bytes=4 << 20,
                                              cache_limit=max(3 * (4 << 20), args.count * args.side ** 2), **options)
                ds = remote if name == "bucket alone" else pixfeed.mix([local, remote])
                loader = pixfeed.make_loader(ds, args.batch_size, seed=rep, num_workers=0)
                start = time.perf_counter()
                next(iter(loader))
                times[name].append(time.perf_counter() - start)
                shutil.rmtree(cache, ignore_errors=True)
        alone, mixed = (statistics.median(times[name]) for name in times)
        print(f"first batch of {args.batch_size}, {args.count:,} images per pack, {args.reps} runs each, alternating: "
              f"bucket alone {alone:.3f} s, mixture {mixed:.3f} s (median): {mixed / alone:.2f} (goal <= 1.0); "
              f"order {loader.pixfeed_plan.order}")
    finally:
        server.stop()


def per_sample(loader) -> tuple:
    """(wall seconds, CPU seconds of this process) per sample of one epoch."""
    start, cpu, n = time.perf_counter(), time.process_time(), 0
    for images, _ in loader:
        n += len(images)
    return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n


def reads(one, mixture, batches: int, batch: int) -> None:
    """CPU time per sample of ``get_batch`` alone, one pack against the mixture, batches alternating."""
    rng = np.random.default_rng(0)
    times = {"one pack": [], "mixture": []}
    for _ in range(batches):
        for name, ds in (("one pack", one), ("mixture", mixture)):
            indices = rng.permutation(len(ds))[:batch]
            start = time.process_time()
            ds.get_batch(indices)
            times[name].append((time.process_time() - start) / batch)
    one_us, mixed_us = (statistics.median(times[name]) * 1e6 for name in ("one pack", "mixture"))
    print(f"  get_batch alone, {batches} batches each: one pack {one_us:.2f}, mixture {mixed_us:.2f} us CPU per "
          f"sample (median): {mixed_us / one_us:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="images per pack")
    parser.add_argument("--size", type=int, default=224, help="read size (0: as stored)")
    parser.add_argument("--side", type=int, default=256, help="stored images: side x side")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--weights", type=float, nargs=2, default=None)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--reads", type=int, default=0, help="also time this many get_batch calls alone")
    parser.add_argument("--format", choices=("mmap", "wds"), default="mmap",
                        help="wds: a StreamMixture, both read with num_workers=0 (this process's CPU time)")
    parser.add_argument("--bucket", action="store_true", help="first batch: a bucket pack alone vs mixed with a local one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.bucket:
            return first_batches(root, args)
        make_pack(root / "a", args.count, 0, args.format, args.side)
        make_pack(root / "b", args.count, 1, args.format, args.side)
        options = {"size": args.size} if args.size else {}
        a, b = (pixfeed.open_dataset(root / name, **options) for name in "ab")
        mixture = pixfeed.mix([a, b], args.weights)
        workers = {"num_workers": 0} if args.format == "wds" else {}
        loaders = {"one pack": pixfeed.make_loader(a, args.batch_size, seed=1, **workers),
                   "mixture": pixfeed.make_loader(mixture, args.batch_size, seed=1, **workers)}
        times = {name: [] for name in loaders}
        for loader in loaders.values():
            per_sample(loader)  # warm: page cache, batch buffers
        for _ in range(args.reps):
            for name, loader in loaders.items():
                times[name].append(per_sample(loader))
        print(f"{args.format}: {args.count:,} images per pack, read at {args.size or 'the stored size'}, batch {args.batch_size}, "
              f"{args.reps} epochs each, alternating; median (best) us per sample")
        for name in loaders:
            wall, cpu = ([t[k] for t in times[name]] for k in (0, 1))
            print(f"  {name:<9} wall {statistics.median(wall) * 1e6:7.2f} ({min(wall) * 1e6:7.2f})   "
                  f"CPU {statistics.median(cpu) * 1e6:7.2f} ({min(cpu) * 1e6:7.2f})")
        for k, kind in enumerate(("wall", "CPU")):
            mixed, one = ([t[k] for t in times[name]] for name in ("mixture", "one pack"))
            print(f"  mixture / one pack, {kind}: median {statistics.median(mixed) / statistics.median(one):.3f}, "
                  f"best {min(mixed) / min(one):.3f} (goal <= 1.05)")
        if args.reads and args.format == "mmap":
            mixture.use_seed(1)
            reads(a, mixture, args.reads, args.batch_size)

if __name__ == "__main__":
    main()
