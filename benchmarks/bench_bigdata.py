"""Datasets larger than memory: cold and over-budget epochs against the disk's cold sequential rate.

    python benchmarks/bench_bigdata.py                      # ~3 GB of 256x256 pixels, ~4 minutes
    python benchmarks/bench_bigdata.py --records 5000 --encoded 2000 --work /tmp/bd
    python benchmarks/bench_bigdata.py --records 5000 --cold-only   # the sequential references, cold and cgroup epochs
    python benchmarks/bench_bigdata.py --records 5000 --cold-only --cgroup-fraction 0.25   # a cgroup of a quarter

Needs root and a cgroup v1 memory controller (``/sys/fs/cgroup/memory``) for
the over-budget rows.  Everything is measured in one run, as ratios:

* ``sequential``: ``pagecache.read_rate`` of ``images.npy`` after evicting it
  (``fsync`` + ``posix_fadvise(DONTNEED)``): one stream, one read at a time.
* ``sequential_depth``: the same file read in order with ``--io-depth`` (16)
  reads of 1 MiB in flight (``storage.depth.sequential_rate``): what the
  device gives a reader that keeps its queue full.  Every cold row is
  reported against both, with what ``make_loader``'s ``io_depth="auto"``
  chose here and why.
* cold first epoch, shuffled, through ``make_loader`` (in process, checksums
  on), with read-ahead read by ``--io-depth`` threads, with read-ahead as
  ``posix_fadvise(WILLNEED)`` (``io_depth=0``, taken right after, for a fair
  pair on a shared machine) and without read-ahead (``io_ahead=0``); in
  quasi-random order, with depth and WILLNEED; and shuffled from the same
  records repacked as LMDB and HDF5 stored pixels, with depth and WILLNEED,
  and with WILLNEED from the records' ranges looked up as in a pack made
  before ``extents.npy`` (its manifest given without it).
* a child process in a cgroup limited to half the dataset (``--cgroup-fraction``): two epochs shuffled
  and two quasi-random (``order="quasi_random"``), each read ahead with depth
  and with WILLNEED, against both references; its peak cgroup usage and RSS
  growth; for each epoch and for a sequential read with depth in the same
  cgroup, the child's own stalls: its threads' time in direct reclaim and on
  refaulted pages (the kernel's delay accounting, ``machine.delays``, turned
  on before the child starts), summed over threads as a share of the read's
  wall time, and the cgroup's own ``memory.stat`` file refaults and major
  faults and its limit hits (``memory.failcnt``).  ``--cold-only`` stops here.
* encoded records (mmap, decoded in workers at 224): cold first epoch with and
  without read-ahead against a warm epoch.
* warm stored pixels (batches of 64, as ``pixfeed bench``), checksums on and
  off, against one thread's memory copy.
* shuffle quality: mean distinct classes per batch, quasi-random vs full shuffle.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

from pixfeed.machine import memlimit as _memlimit
from pixfeed.machine.delays import Delays, delay_accounting, process_delays, thread_delays
from pixfeed.machine.memory import memory_stat
from pixfeed.bench.ceilings import memcopy
from pixfeed.datasets import open_dataset
from pixfeed.loaders import make_loader
from pixfeed.manifest import read_manifest
from pixfeed.packers import pack
from pixfeed.storage.depth import sequential_rate
from pixfeed.storage.pagecache import evict, read_rate, resident_fraction

CLASSES = 100
POOL_THREAD = "pixfeed-io-depth"  # storage.depth's reader threads
REFERENCE_DEPTH = 16  # reads in flight of the sequential reference and the rows read with depth
DISTINCT = 200  # distinct source images; the rest are hard links to them


def source(root: Path, count: int) -> Path:
    """``count`` 256x256 JPEGs in ``CLASSES`` class folders, class by class (as ImageFolder sorts)."""
    rng = np.random.default_rng(0)
    originals = root / "originals"
    originals.mkdir(parents=True, exist_ok=True)
    for k in range(DISTINCT):
        smooth = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        img = Image.fromarray(smooth).resize((256, 256), Image.BILINEAR)
        noisy = np.clip(np.asarray(img) + rng.normal(0, 12, (256, 256, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(originals / f"{k}.jpg", quality=90)
    for i in range(count):
        folder = root / "src" / f"c{i * CLASSES // count:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        os.link(originals / f"{i % DISTINCT}.jpg", folder / f"{i:06d}.jpg")
    return root / "src"


def epoch(loader, epochs: int = 1, keep: bool = False, each=None) -> dict:
    """The last of ``epochs`` epochs; the loader (its workers, its mappings) is gone on return unless ``keep``;
    ``each()`` called at each batch of it."""
    for _ in range(epochs - 1):
        for _ in loader:
            pass
    start, images, nbytes = time.perf_counter(), 0, 0
    for batch, labels in loader:
        if each is not None:
            each()
        images += len(labels)
        nbytes += batch.numel()
    seconds = time.perf_counter() - start
    if not keep:
        del loader
        gc.collect()
    return {"images_per_s": images / seconds, "bytes_per_s": nbytes / seconds, "images": images}


def files_of(path: Path) -> list:
    return [p for p in Path(path).iterdir() if p.suffix in (".npy", ".bin", ".mdb", ".h5")]


def cold(path: Path) -> None:
    """Evict the dataset's files; pages still mapped by a dataset that is gone would stay cached."""
    gc.collect()
    evict(files_of(path))


def cold_epoch(path: Path, manifest: Optional[dict] = None, **options) -> dict:
    cold(path)
    return epoch(make_loader(open_dataset(path, manifest=manifest), 256, num_workers=0, seed=1, **options))


def without_extents(path: Path) -> dict:
    """The manifest of the LMDB or HDF5 pack ``path`` as one made before ``extents.npy``: read-ahead looks the
    records up (LMDB, HDF5's chunk index) instead of reading their ranges from it."""
    manifest = read_manifest(path)
    return {**manifest, "files": {k: v for k, v in manifest["files"].items() if k != "extents.npy"}}


def references(data: Path, depth: int) -> dict:
    """The cold sequential reads of ``data``: one stream, and ``depth`` reads of 1 MiB in flight; what
    make_loader's io_depth='auto' chooses here."""
    auto = make_loader(open_dataset(data.parent), 256, num_workers=0).pixfeed_plan
    one = read_rate([data], cold=True)
    evict([data])
    resident = resident_fraction([data])
    deep = sequential_rate([data], depth)["bytes_per_s"]
    return {"sequential": one["bytes_per_s"], "sequential_depth": deep, "io_depth": depth, "auto_io_depth":
            auto.io_depth, "auto_io_depth_reason": auto.reasons["io_depth"],
            "resident_before": max(one["resident_before"] or 0.0, resident or 0.0)}


def stall_mark(group: Path) -> dict:
    """Where a read's stall figures start: the clock, this process's delays (all its threads), the cgroup's
    ``memory.stat`` counters and its limit hits."""
    return {"clock": time.perf_counter(), "delays": process_delays(), "stat": memory_stat(group),
            "pool": pool_delays({}), "hits": _memlimit.usage(group)["failcnt"]}


def pool_delays(seen: dict) -> dict:
    """``seen`` updated with the delays of the depth pool's live threads, by thread id (a thread's figures can be
    read only while it lives: the pool's threads end once the order's tail is requested)."""
    for thread in threading.enumerate():
        if thread.name == POOL_THREAD:
            try:
                seen[thread.native_id] = thread_delays(thread.native_id)
            except ProcessLookupError:  # it ended since enumerate(): its last figures stand
                pass
    return seen


def stalls_since(mark: dict, group: Path, pool: Optional[dict] = None) -> dict:
    """Since ``mark``: this process's threads' time in direct reclaim and on refaulted pages (thrashing), each
    summed over threads as a share of the wall time, with the counts of waits; the cgroup's file refaults, major
    faults and limit hits.  Not block I/O: the kernel counts a thread's wait on I/O when another wakes it, and
    new threads of the depth pool were charged the machine's uptime for a first wait (6.18)."""
    now = stall_mark(group)
    seconds = now["clock"] - mark["clock"]
    spent = now["delays"] - mark["delays"]
    # the depth pool's own waits (reading ahead is its work; ``pool``: its threads' delays as last seen, by
    # pool_delays during the read) taken out: what the threads that read batches waited
    pool = [d - mark["pool"].get(t, Delays(0, 0, 0, 0, 0, 0)) for t, d in {**(pool or {}), **now["pool"]}.items()]
    outside = lambda kind: None if getattr(spent, f"{kind}_ns") is None else (  # noqa: E731
        getattr(spent, f"{kind}_ns") - sum(getattr(d, f"{kind}_ns") or 0 for d in pool)) / 1e9 / max(seconds, 1e-9)
    grew = lambda name: now["stat"][name] - mark["stat"][name] if name in now["stat"] else None  # noqa: E731
    return {"seconds": seconds, "reclaim": spent.share("reclaim", seconds), "reclaim_count": spent.reclaim_count,
            "thrashing": spent.share("thrashing", seconds), "thrashing_count": spent.thrashing_count,
            "delays_reason": spent.reason, "reader_reclaim": outside("reclaim"),
            "reader_thrashing": outside("thrashing"),
            "refaults": grew("workingset_refault_file"), "majfaults": grew("pgmajfault"),
            "hits": now["hits"] - mark["hits"]}


def child(group: str, path: str, depth: str) -> None:
    """In the cgroup: a cold sequential read of the data file (with depth), then two epochs shuffled and two
    quasi-random, each read ahead with ``depth`` reads in flight and with WILLNEED (in turns); for each, this
    process's stalls and the cgroup's refaults and limit hits (``stalls_since``); RSS and the cgroup's peak."""
    _memlimit.join(Path(group))
    rss = lambda: int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmRSS")))  # noqa: E731,E501
    before, out, stalls, group = rss(), {}, {}, Path(group)
    files = files_of(Path(path))
    evict(files)
    mark = stall_mark(group)
    out["sequential_depth"] = sequential_rate([Path(path) / "images.npy"], int(depth))["bytes_per_s"]
    stalls["sequential_depth"] = [stalls_since(mark, group)]
    evict(files)
    for order in ("random", "quasi_random"):
        for name, io_depth in ((order, int(depth)), (f"{order}_willneed", 0)):
            loader = make_loader(open_dataset(path), 256, num_workers=0, seed=1, order=order, io_depth=io_depth)
            out[name], stalls[name] = [], []
            for _ in range(2):
                mark = stall_mark(group)
                seen = dict(mark["pool"])
                out[name].append(epoch(loader, keep=True, each=lambda: pool_delays(seen))["bytes_per_s"])
                stalls[name].append(stalls_since(mark, group, seen))
            plan = str(loader.pixfeed_plan)
            del loader
            gc.collect()
        out[f"{order}_plan"] = [row for row in plan.splitlines()
                                if row.split()[:1] in (["storage"], ["io_ahead"], ["io_depth"], ["order"])]
    out["stalls"] = stalls
    out["rss_growth_kib"] = rss() - before
    out["cgroup"] = _memlimit.usage(group)
    print(json.dumps(out))


def over_budget(path: Path, limit: int, depth: int) -> dict:
    """The child's rows; delay accounting is on from before the child starts (the kernel counts only the
    threads created while it is on) to its end, then back as it was."""
    with _memlimit.memory_cgroup(limit) as group, delay_accounting():
        done = subprocess.run([sys.executable, __file__, "--child", str(group), str(path), str(depth)],
                              capture_output=True, text=True)
    if done.returncode != 0:  # what the child said (a cgroup too small for the loader, an OOM kill: -9)
        raise SystemExit(f"the child in a cgroup of {limit / 2**20:.0f} MiB ended with status {done.returncode}:\n"
                         f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def warm_rows(path: Path, tries: int = 3) -> dict:
    """Warm epochs (every page cached: checked) of batches of 64, checksums on and off, and one thread's memory
    copy, each the best of ``tries`` taken in turns: on a shared machine a row measured alone caught other
    work's bursts (22% of memory copy one run, 60% the next)."""
    loaders = {"warm_checksums": make_loader(open_dataset(path), 64, num_workers=0, seed=1),
               "warm_no_checksums": make_loader(open_dataset(path, checksums=False), 64, num_workers=0, seed=1)}
    for loader in loaders.values():
        for _ in loader:  # reads every page in
            pass
    rows = {name: 0.0 for name in [*loaders, "memcopy"]}
    rows["resident"] = resident_fraction(files_of(path))
    for _ in range(tries):
        rows["memcopy"] = max(rows["memcopy"], memcopy()["bytes_per_s"])
        for name, loader in loaders.items():
            rows[name] = max(rows[name], epoch(loader, keep=True)["bytes_per_s"])
    return rows


def distinct_classes(dataset, batch: int, **options) -> float:
    loader = make_loader(dataset, batch, num_workers=0, seed=1, **options)
    labels = np.asarray(dataset.handle["labels"])[list(loader.sampler)]
    return float(np.mean([len(set(labels[k:k + batch])) for k in range(0, len(labels) - batch + 1, batch)]))


def encoded_rows(path: Path) -> dict:
    dataset = open_dataset(path, size=224)
    run = lambda epochs=1, **o: epoch(make_loader(dataset, 128, num_workers=2, seed=1, **o),  # noqa: E731
                                      epochs)["images_per_s"]
    cold(path)
    without = run(io_ahead=0)
    cold(path)
    first = run()
    warm = run(epochs=2)
    return {"cold": first, "cold_no_read_ahead": without, "warm": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=15_000)
    parser.add_argument("--encoded", type=int, default=4_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/pixfeed-bigdata"))
    parser.add_argument("--io-depth", type=int, default=REFERENCE_DEPTH,
                        help="reads in flight for the rows read with depth and the sequential reference")
    parser.add_argument("--cgroup-fraction", type=float, default=0.5,
                        help="the cgroup's memory limit as a fraction of the dataset's bytes (default 0.5)")
    parser.add_argument("--cold-only", action="store_true",
                        help="only the sequential references, cold and over-budget epochs")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    pixels, encoded = args.work / f"pixels-{args.records}", args.work / f"encoded-{args.encoded}"
    if not pixels.exists():
        pack(source(args.work / f"src-{args.records}", args.records), pixels, "mmap", store="pixels", size=256)
    if not encoded.exists() and not args.cold_only:
        pack(source(args.work / f"src-e{args.encoded}", args.encoded), encoded, "mmap", store="encoded")
    data = pixels / "images.npy"
    size = data.stat().st_size
    rows = references(data, args.io_depth)
    deep = {"io_depth": args.io_depth}
    for name, options in (("cold_shuffled", deep), ("cold_shuffled_willneed", {"io_depth": 0}),
                          ("cold_shuffled_no_read_ahead", {"io_ahead": 0}),
                          ("cold_quasi_random", {"order": "quasi_random", **deep}),
                          ("cold_quasi_random_willneed", {"order": "quasi_random", "io_depth": 0})):
        rows[name] = cold_epoch(pixels, **options)["bytes_per_s"]
    for fmt in ("lmdb", "hdf5"):  # the same records in the other map-style formats, shuffled
        other = args.work / f"pixels-{args.records}-{fmt}"
        if not other.exists():
            pack(pixels, other, fmt, store="pixels")
        rows[f"cold_shuffled_{fmt}"] = cold_epoch(other, **deep)["bytes_per_s"]
        rows[f"cold_shuffled_{fmt}_willneed"] = cold_epoch(other, io_depth=0)["bytes_per_s"]
        rows[f"cold_shuffled_{fmt}_lookups"] = cold_epoch(other, without_extents(other), io_depth=0)["bytes_per_s"]
    gc.collect()
    rows["over_budget"] = over_budget(pixels, int(size * args.cgroup_fraction), args.io_depth) \
        if _memlimit.cgroup_parent() else None
    if args.cold_only:
        report_cold(rows, size, args.records)
        return print(json.dumps(rows))
    rows["encoded"] = encoded_rows(encoded)
    rows.update(warm_rows(pixels))
    dataset = open_dataset(pixels)
    rows["classes_per_batch"] = {"random": distinct_classes(dataset, 256),
                                 "quasi_random": distinct_classes(dataset, 256, order="quasi_random")}
    report(rows, size, args.records)


def gb(rate: float) -> str:
    return f"{rate / 1e9:.2f} GB/s"


def report_cold(rows: dict, size: int, records: int) -> None:
    seq, deep = rows["sequential"], rows["sequential_depth"]
    print(f"{records} records of 256x256x3, {size / 2**30:.2f} GiB; cold sequential read {gb(seq)} (one stream), "
          f"{gb(deep)} with {rows['io_depth']} reads in flight ({rows['resident_before']:.0%} cached before)")
    print(f"  make_loader's io_depth='auto' here: {rows['auto_io_depth']} ({rows['auto_io_depth_reason']})")
    print("cold first epoch                   GB/s     of one stream  of sequential with depth")
    for label, name in (("shuffled, read with depth", "cold_shuffled"),
                        ("shuffled, WILLNEED", "cold_shuffled_willneed"),
                        ("shuffled, no read-ahead", "cold_shuffled_no_read_ahead"),
                        ("quasi-random, read with depth", "cold_quasi_random"),
                        ("quasi-random, WILLNEED", "cold_quasi_random_willneed"),
                        ("LMDB shuffled, read with depth", "cold_shuffled_lmdb"),
                        ("LMDB shuffled, WILLNEED", "cold_shuffled_lmdb_willneed"),
                        ("  the same, looked up", "cold_shuffled_lmdb_lookups"),
                        ("HDF5 shuffled, read with depth", "cold_shuffled_hdf5"),
                        ("HDF5 shuffled, WILLNEED", "cold_shuffled_hdf5_willneed"),
                        ("  the same, looked up", "cold_shuffled_hdf5_lookups")):
        print(f"  {label:<33}{rows[name] / 1e9:5.2f}    {rows[name] / seq:6.0%}        {rows[name] / deep:6.0%}")
    over = rows["over_budget"]
    if over:
        for name in ("random", "random_willneed", "quasi_random", "quasi_random_willneed"):
            how = "WILLNEED" if name.endswith("willneed") else f"depth {rows['io_depth']}"
            print(f"{size / over['cgroup']['limit']:.0f}x the cgroup limit, {name.replace('_willneed', ''):<12} {how:<9} epochs " +
                  ", ".join(f"{r / seq:.0%}" for r in over[name]) + " of one stream, " +
                  ", ".join(f"{r / deep:.0%}" for r in over[name]) + " of sequential with depth")
        print(f"  cgroup peak {over['cgroup']['max_usage'] / 2**20:.0f} MiB of {over['cgroup']['limit'] / 2**20:.0f}"
              f" MiB limit, hit {over['cgroup']['failcnt']} times; RSS growth {over['rss_growth_kib'] / 1024:.0f} MiB")
        report_stalls(over, rows["io_depth"])


def report_stalls(over: dict, depth: int) -> None:
    """The child's stalls per read: its own (delay accounting) and its cgroup's (memory.stat, failcnt)."""
    def row(s: dict) -> str:
        share = lambda x: "n/a" if x is None else f"{x:.1%}"  # noqa: E731
        return (f"reclaim {share(s['reclaim']):>6} ({s['reclaim_count']} waits), thrashing "
                f"{share(s['thrashing']):>6} ({s['thrashing_count']} waits); {s['refaults']} refaults, "
                f"{s['majfaults']} major faults, {s['hits']} limit hits; outside the depth pool: reclaim "
                f"{share(s.get('reader_reclaim'))}, thrashing {share(s.get('reader_thrashing'))}")
    print("  stalls in the cgroup, per read: the child's threads in direct reclaim and on refaulted pages "
          "(thrashing),\n  summed over threads as a share of the read's wall time; the cgroup's file refaults, "
          "major faults, limit hits;\n  and the same delays outside the depth pool's threads (the threads that "
          "read batches: reading ahead is the pool's work)")
    first = over["stalls"]["sequential_depth"][0]
    if first["delays_reason"]:
        print(f"  (no delay accounting: {first['delays_reason']})")
    print(f"    {f'sequential, depth {depth}':<33}{row(first)} ({gb(over['sequential_depth'])})")
    for name in ("random", "random_willneed", "quasi_random", "quasi_random_willneed"):
        how = "WILLNEED" if name.endswith("willneed") else f"depth {depth}"
        order = name.replace("_willneed", "")
        for k, s in enumerate(over["stalls"][name], 1):
            print(f"    {f'{order}, {how}, epoch {k}':<33}{row(s)}")


def report(rows: dict, size: int, records: int) -> None:
    report_cold(rows, size, records)
    enc = rows["encoded"]
    print(f"encoded, cold first epoch:         {enc['cold']:.0f} images/s = {enc['cold'] / enc['warm']:.0%} of warm "
          f"({enc['warm']:.0f}); without read-ahead {enc['cold_no_read_ahead'] / enc['warm']:.0%}")
    mc = rows["memcopy"]
    print(f"warm stored pixels, checksums on:  {gb(rows['warm_checksums'])} = {rows['warm_checksums'] / mc:.0%} of "
          f"memory copy ({gb(mc)}); checksums off {rows['warm_no_checksums'] / mc:.0%} "
          f"({rows['resident']:.0%} of its pages cached)")
    q = rows["classes_per_batch"]
    print(f"distinct classes per batch of 256 ({CLASSES} classes): full shuffle {q['random']:.1f}, "
          f"quasi-random {q['quasi_random']:.1f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
