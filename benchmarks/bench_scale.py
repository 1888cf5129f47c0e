"""Datasets of many records: nothing per record in any process's Python heap.

    python benchmarks/bench_scale.py --records 1000000 [--base 10000] [--format mmap] [--batches 200]

Writes a source of N tiny JPEGs in 1,000 class folders as hard links to a few
thousand distinct files (so the source costs little disk and time), packs it
(encoded, the default store of every format but mmap: ``--store``), then in a
fresh process each: opens it, reads the first item, and reads ``--batches``
batches of 256 through ``make_loader(num_workers=2)``, recording RssAnon (from
/proc/PID/status) of the training process and of each worker after the last
batch.  The same runs on a ``--base``-record dataset give the ratios.  Output:
one JSON line per dataset size, then a table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

DISTINCT = 4000
CLASSES = 1000


def make_source(root: Path, records: int) -> Path:
    """``records`` tiny JPEGs: hard links to DISTINCT 8x8 files, spread over CLASSES folders."""
    if (root / "done").exists():
        return root
    rng = np.random.default_rng(0)
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    for j in range(DISTINCT):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(blobs / f"{j}.jpg", quality=90)
    src = root / "src"
    for c in range(CLASSES):
        (src / f"c{c:04d}").mkdir(parents=True, exist_ok=True)
    for i in range(records):
        os.link(blobs / f"{i % DISTINCT}.jpg", src / f"c{i % CLASSES:04d}" / f"{i:09d}.jpg")
    (root / "done").touch()
    return root


READ = r'''
import json, sys, time
start = time.perf_counter()
import pixfeed
path, batches = sys.argv[1], int(sys.argv[2])

def rss_anon(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0

import pixfeed.datasets, pixfeed.loaders  # imports are not the open
t0 = time.perf_counter()
ds = pixfeed.open_dataset(path, size=8)
t1 = time.perf_counter()
ds[0]
t2 = time.perf_counter()
loader = pixfeed.make_loader(ds, 256, num_workers=2, persistent_workers=True)
it = iter(loader)
next(it)
t3 = time.perf_counter()
done = 1
while done < batches:  # over as many epochs as it takes (persistent workers)
    for _ in it:
        done += 1
        if done == batches:
            break
    else:
        it = iter(loader)
import os, pathlib
me = os.getpid()
workers = []
for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        cmd = (stat.parent / "cmdline").read_bytes()
    except OSError:
        continue
    if int(fields[1]) == me and b"python" in cmd:  # the DataLoader workers (forked: this process's command)
        workers.append(int(stat.parent.name))
out = {"open_s": t1 - t0, "first_item_s": t2 - t1, "first_batch_s": t3 - t2,
       "rss_anon_main": rss_anon("self"), "rss_anon_workers": [rss_anon(p) for p in workers]}
print(json.dumps(out))
'''


def measure(work: Path, records: int, fmt: str, store: str, batches: int) -> dict:
    root = make_source(work / f"src-{records}", records)
    dst = work / f"{fmt}-{store}-{records}"
    if not (dst / "pixfeed.json").exists():
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pixfeed.cli", "pack", str(root / "src"), str(dst), "--format", fmt,
                        "--store", store, "-q", *(["--size", "8"] if store == "pixels" else [])], check=True)
        pack_s = time.perf_counter() - start
    else:
        pack_s = float("nan")
    done = subprocess.run([sys.executable, "-c", READ, str(dst), str(batches)], check=True, capture_output=True,
                          text=True)
    return {"records": records, "pack_images_per_s": records / pack_s, **json.loads(done.stdout.splitlines()[-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--base", type=int, default=10_000)
    p.add_argument("--format", default="mmap")
    p.add_argument("--store", default="encoded")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--work", type=Path, default=Path("bench-out/scale"))
    args = p.parse_args()
    rows = []
    for n in (args.base, args.records):
        rows.append(measure(args.work, n, args.format, args.store, args.batches))
        print(json.dumps(rows[-1]), flush=True)
    base, big = rows
    mib = 2 ** 20
    print(f"\n{args.format}/{args.store}, batches of 256, 2 workers, {args.batches} batches; load {os.getloadavg()[0]:.1f}")
    print(f"| figure | {base['records']:,} records | {big['records']:,} records | ratio or difference |")
    print("|---|---|---|---|")
    print(f"| pack rate (images/s) | {base['pack_images_per_s']:,.0f} | {big['pack_images_per_s']:,.0f} | "
          f"{big['pack_images_per_s'] / base['pack_images_per_s']:.2f}x |")
    for key, unit in (("open_s", "ms"), ("first_item_s", "ms"), ("first_batch_s", "ms")):
        print(f"| {key[:-2].replace('_', ' ')} | {base[key] * 1e3:.1f} ms | {big[key] * 1e3:.1f} ms | "
              f"{(big[key] - base[key]) * 1e3:+.1f} ms |")
    print(f"| RssAnon, training process | {base['rss_anon_main'] / mib:.0f} MiB | {big['rss_anon_main'] / mib:.0f} MiB | "
          f"{(big['rss_anon_main'] - base['rss_anon_main']) / mib:+.0f} MiB |")
    for w, (a, b) in enumerate(zip(base["rss_anon_workers"], big["rss_anon_workers"])):
        print(f"| RssAnon, worker {w} | {a / mib:.0f} MiB | {b / mib:.0f} MiB | {(b - a) / mib:+.0f} MiB |")


if __name__ == "__main__":
    main()
