"""A dataset twice the size of a real cgroup v1 memory limit: read completely and correctly, RSS flat.

The reader runs in a child process that joins a fresh child cgroup of ours
(``pixfeed.machine.memlimit``) after importing everything, so the limit holds only
what it reads from then on: the page cache of a 64 MiB dataset, evicted first
so that every page is read under the limit.  It reports a digest of every
(label, pixels) it got, its peak usage and the RSS of file pages (``RssFile``)
of itself and its workers, before and after the epoch.  Workers' own memory
(forked pages, batches in shared memory) is charged to the cgroup as well, so
it gets ``WORKER_MEMORY`` more per worker: the page cache left is still well
under half the data.  Skipped where there is
no writable v1 memory controller (not root).
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_image
from pixfeed.machine import memlimit as _memlimit
from pixfeed.datasets import open_dataset
from pixfeed.packers import pack

LIMIT = 32 << 20
WORKER_MEMORY = 16 << 20  # a forked worker's own pages and its batches in shared memory, charged to the cgroup too
SIDE = 128  # 48 KiB a record
RECORDS = 1400  # 64 MiB of pixels

pytestmark = pytest.mark.skipif(_memlimit.cgroup_parent() is None, reason="needs a writable cgroup v1 memory "
                                "controller (root, /sys/fs/cgroup/memory)")

CHILD = r"""
import json, os, sys
from pathlib import Path
import numpy as np
from pixfeed.machine import memlimit as _memlimit
from pixfeed.checksum import record_hash
from pixfeed.datasets import lmdb as lmdb_reader
from pixfeed.datasets import open_dataset
from pixfeed.loaders import make_loader
from pixfeed.storage.pagecache import evict

group, path, workers, order = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lmdb_reader.UNMAP_EVERY = 4 << 20

def read(path):
    try:  # a thread or a process may end between listing and reading (a read-ahead thread's epoch ends)
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""

def rss_file():
    pids = [os.getpid()] + [int(p) for t in os.listdir("/proc/self/task")
                            for p in read(f"/proc/self/task/{t}/children").split()]
    out = {}
    for pid in pids:
        for line in read(f"/proc/{pid}/status").splitlines():
            if line.startswith("RssFile"):
                out[pid] = int(line.split()[1]) << 10
    return out

_memlimit.join(Path(group))
evict([p for p in path.iterdir() if p.name != "pixfeed.json"])
loader = make_loader(open_dataset(path), 32, num_workers=workers, order=order, seed=0)
digests, first, peak = [], None, {}
for images, labels in loader:
    for image, label in zip(images, labels):
        digests.append([int(label), record_hash(image.permute(1, 2, 0).contiguous().numpy())])
    now = rss_file()
    first = first or now
    peak = {pid: max(peak.get(pid, 0), rss) for pid, rss in now.items()}
growth = max(peak[pid] - first.get(pid, peak[pid]) for pid in peak)
print(json.dumps({"digests": digests, "growth": growth, "usage": _memlimit.usage(Path(group)),
                  "plan": str(loader.pixfeed_plan)}))
"""


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    originals = [write_image(root / "originals" / f"{k}.png", size=(SIDE, SIDE), seed=k, fmt="PNG")
                 for k in range(40)]
    for i in range(RECORDS):
        target = root / "src" / f"c{i * 10 // RECORDS}" / f"{i:05d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(originals[i % len(originals)], target)
    for fmt in ("mmap", "lmdb"):
        pack(root / "src", root / fmt, fmt, store="pixels", size=SIDE)
    return root


def read_under_limit(path: Path, workers: int, order: str) -> dict:
    with _memlimit.memory_cgroup(LIMIT + workers * WORKER_MEMORY) as group:
        done = subprocess.run([sys.executable, "-c", CHILD, str(group), str(path), str(workers), order],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, f"reader died ({done.returncode}) under the limit: {done.stderr[-2000:]}"
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("fmt,workers,order", [("mmap", 0, "random"), pytest.param(
    "lmdb", 2, "quasi_random", marks=pytest.mark.xfail(strict=False, reason=(
        "known gap (issue 15): LMDB workers' mapped pages grew 37 MiB once in CI; the records and "
        "checksums were all right and the process stayed under its limit")))])
def test_reads_twice_its_memory_limit_completely_with_flat_rss(big, fmt, workers, order):
    dataset = open_dataset(big / fmt)
    stored, labels, checksums = dataset.read_stored(np.arange(len(dataset)))
    assert sum(np.asarray(s).nbytes for s in stored) >= 2 * LIMIT
    del dataset, stored
    gc.collect()  # unmap the files here: pages mapped by this process would stay cached for the reader
    got = read_under_limit(big / fmt, workers, order)
    assert sorted(map(tuple, got["digests"])) == sorted(zip(labels.tolist(), (int(c) for c in checksums)))
    usage = got["usage"]
    assert usage["limit"] == LIMIT + workers * WORKER_MEMORY
    assert usage["failcnt"] > 0 or usage["max_usage"] > LIMIT // 2  # pages were read under the limit
    assert got["growth"] < 8 << 20  # mapped file pages of the reader and each worker: flat, not 32-64 MiB
    assert "storage            disk" in got["plan"] and f"order              {order}" in got["plan"]
