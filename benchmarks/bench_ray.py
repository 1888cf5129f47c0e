"""The ray executor against the local one, and the task plan of a 1M-file listing.

    python benchmarks/bench_ray.py SRC [--reps 3] [--files 1000000]

1. Pack rate: SRC is packed with the local executor (a process pool on every
   usable CPU) and with the ray executor (a local Ray on the same CPUs, started
   once before, as a cluster is up before its jobs), alternating, best of
   ``--reps`` each, for mmap pixels (decode-bound) and mmap encoded (I/O and
   overhead-bound).  Prints images/s and ray/local.  Ray's start-up is timed
   apart.  Each local pack runs in a child process of its own session (timed
   inside it, start-up excluded), as Ray's processes do: with Linux's
   autogroup scheduling, a session shares a loaded machine's CPUs as a group,
   so a pool in this script's session would get less than Ray's workers.
2. Plan scale (in a fresh process, so its peak RSS is the driver's): a
   synthetic listing of ``--files`` paths (ImageNet-like names and sizes), the
   mmap and wds plans for a 64-CPU cluster, the writer as ``ray.put`` ships it
   (pickled), and the per-task results the driver joins at the end of such a
   pack; prints seconds, task counts and peak RSS.
"""
from __future__ import annotations

import argparse
import json
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pixfeed.machine.cpus import available_cpus
from pixfeed.packers import PackOptions, pack
from pixfeed.packers.writer import TaskResult
from pixfeed.registry import get, writer_class
from pixfeed.sources.folder import Source

CLUSTER_CPUS = 64


def timed_pack(src: str, out: Path, store: str, executor: str) -> float:
    start = time.perf_counter()
    pack(src, out, "mmap", store=store, overwrite=True, executor=executor, **({"size": 224} if store == "pixels" else {}))
    return time.perf_counter() - start


def pack_seconds(src: str, out: Path, store: str, executor: str) -> float:
    if executor == "ray":
        return timed_pack(src, out, store, executor)
    cmd = [sys.executable, __file__, src, "--time-local", str(out), "--store", store]
    return float(subprocess.run(cmd, check=True, capture_output=True, text=True, start_new_session=True).stdout)


def rates(src: str, reps: int) -> None:
    import ray

    start = time.perf_counter()
    ray.init(num_cpus=available_cpus(), include_dashboard=False, log_to_driver=False)
    print(f"ray start-up: {time.perf_counter() - start:.1f} s ({available_cpus()} CPUs)")
    with tempfile.TemporaryDirectory() as tmp:
        for store in ("pixels", "encoded"):
            best = {"local": float("inf"), "ray": float("inf")}
            for _ in range(reps):
                for executor in best:
                    best[executor] = min(best[executor], pack_seconds(src, Path(tmp) / "ds", store, executor))
            count = json.loads((Path(tmp) / "ds" / "pixfeed.json").read_text())["count"]
            local, remote = count / best["local"], count / best["ray"]
            print(f"mmap {store:8s} {count} images: local {local:7.1f} img/s, ray {remote:7.1f} img/s, "
                  f"ray/local {remote / local:.2f}")
    ray.shutdown()


def synthetic_source(files: int) -> Source:
    rng = np.random.default_rng(0)
    paths = [f"n{i % 1000:08d}/img_{i:08d}.JPEG" for i in range(files)]
    return Source(Path("/nonexistent"), paths, [p[:-5] for p in paths], np.arange(files, dtype=np.int64) % 1000,
                  [f"n{c:08d}" for c in range(1000)], rng.integers(20_000, 200_000, files), [])


def plan_scale(files: int) -> None:
    start = time.perf_counter()
    source = synthetic_source(files)
    print(f"listing of {files} files: {time.perf_counter() - start:.1f} s")
    for fmt in ("mmap", "wds"):
        start = time.perf_counter()
        writer = writer_class(fmt)(Path("/nonexistent"), source, PackOptions(store="encoded").resolve(get(fmt)))
        tasks = writer.plan(CLUSTER_CPUS)
        shipped = len(pickle.dumps(writer, protocol=5))
        per_task = [len(t) for t in tasks]
        print(f"{fmt} plan: {time.perf_counter() - start:.1f} s (with pickling), {len(tasks)} tasks of "
              f"{min(per_task)}-{max(per_task)} files, writer shipped once: {shipped / 2**20:.0f} MiB")
    results = [TaskResult(k, t.tolist(), [int(x) | 1 << 63 for x in t], [(375, 500)] * len(t), 0)
               for k, t in enumerate(tasks)]
    print(f"the join's task results: {sum(len(r.kept) for r in results)} records")
    print(f"peak RSS of the driver: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", nargs="?", help="image folder to pack (omit with --plan-only)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--files", type=int, default=1_000_000)
    p.add_argument("--plan-only", action="store_true", help="only the plan-scale part, in this process")
    p.add_argument("--time-local", metavar="DST", help="(internal) print the seconds of one local pack to DST")
    p.add_argument("--store", default="pixels")
    args = p.parse_args()
    if args.time_local:
        return print(timed_pack(args.src, Path(args.time_local), args.store, "local"))
    if args.plan_only:
        return plan_scale(args.files)
    rates(args.src, args.reps)
    start = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--plan-only", "--files", str(args.files)], check=True)
    print(f"plan-scale process: {time.perf_counter() - start:.1f} s in all")


if __name__ == "__main__":
    main()
