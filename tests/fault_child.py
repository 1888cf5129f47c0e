"""Faults that need a process of their own (run by test_loader_faults.py); prints one JSON line.

``shm``: 20 loaders against the 1 MiB /dev/shm of a private mount namespace
(the test starts this script in one), with the CPUs idle, then 20 with two
processes spinning on them.  ``oom``: a worker goes over a cgroup v1 memory
limit; exit status 77 (with the reason) when the machine has no memory
controller or this is not root.  ``ddp RANK PORT``: one of two gloo ranks,
rank 1 losing a DataLoader worker mid-epoch.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch.distributed as dist
from torch.utils.data import get_worker_info

from pixfeed.loaders import make_loader
from pixfeed.loaders._testing import ArrayDataset, random_images

SKIP = 77


def skip(reason: str) -> None:
    print(reason)
    sys.exit(SKIP)


def outcome(make) -> dict:
    start = time.monotonic()
    try:
        batches = sum(1 for _ in make())
        result = f"all batches ({batches})" if batches == 8 else f"{batches} batches"
    except Exception as error:  # noqa: BLE001 - reported to the test
        result = f"{type(error).__name__}: {error}"
    return {"outcome": result.replace(" (8)", ""), "seconds": time.monotonic() - start}


def shm_run(i: int) -> dict:
    """One of four cases, in turn: refused at construction, read in process, fits, /dev/shm filled meanwhile."""
    pixels = ArrayDataset(random_images(256, 64, 64))  # 32 x 12 KiB = 384 KiB a batch
    decoded = ArrayDataset(random_images(256, 64, 64), augment=True)
    if i % 4 == 0:
        return outcome(lambda: make_loader(pixels, 32, num_workers=2))
    if i % 4 == 1:
        return outcome(lambda: make_loader(decoded, 32))
    if i % 4 == 2:
        return outcome(lambda: make_loader(ArrayDataset(random_images(256, 16, 16)), 32, num_workers=2))
    loader = make_loader(ArrayDataset(random_images(256, 16, 16), augment=True), 32, num_workers=2)
    hog = Path("/dev/shm/hog")  # another process takes the space after the plan was made
    hog.write_bytes(b"\0" * max(0, shutil.disk_usage("/dev/shm").free - (16 << 10) * (i % 8)))
    try:
        return outcome(lambda: loader)
    finally:
        hog.unlink()


def shm(busy: int) -> list:
    """20 runs with ``busy`` processes spinning on the CPUs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        return [{"case": i % 4, **shm_run(i)} for i in range(20)]
    finally:
        for p in spinners:
            p.kill()
            p.wait()


class Hungry(ArrayDataset):
    def __getitem__(self, index: int):
        if index == 20:
            np.ones(4 << 30, np.uint8)  # 4 GiB, over the limit
        return super().__getitem__(index)


def oom() -> dict:
    line = [row for row in Path("/proc/self/cgroup").read_text().splitlines() if ":memory:" in row]
    if not line:
        skip("no cgroup v1 memory controller")
    parent = Path("/sys/fs/cgroup/memory") / line[0].split(":", 2)[2].lstrip("/")
    group = parent / f"pixfeed-oom-{os.getpid()}"
    try:
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as e:
        skip(f"cannot make a memory cgroup (root needed): {e}")
    usage = int((group / "memory.usage_in_bytes").read_text())
    (group / "memory.limit_in_bytes").write_text(str(usage + (256 << 20)))
    loader = make_loader(Hungry(random_images(48), augment=True), 8, shuffle=False, num_workers=2)
    result = outcome(lambda: loader)
    return {"error": result["outcome"], "seconds": result["seconds"], "group": str(group)}  # the test removes it


class KilledInRank1(ArrayDataset):
    """Rank 1's worker 0 is killed (SIGKILL) on its third sample."""

    calls = 0

    def __getitem__(self, index: int):
        self.calls += 1
        worker = get_worker_info()
        if os.environ["RANK"] == "1" and worker is not None and worker.id == 0 and self.calls == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


def ddp(rank: int, port: int) -> dict:
    """One of two gloo ranks (a 5 s process-group timeout); rank 1 loses a worker mid-epoch."""
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=5))
    loader = make_loader(KilledInRank1(random_images(64), augment=True), 4, num_workers=2)
    start = time.monotonic()
    try:
        for _ in loader:
            pass
        dist.barrier()  # rank 0 waits here for the rank that failed
        result = "finished"
    except Exception as error:  # noqa: BLE001 - reported to the test
        result = f"{type(error).__name__}: {error}"
    return {"error": result, "seconds": time.monotonic() - start}


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    if sys.argv[1] == "shm":  # run by the test inside a private mount namespace with a 1 MiB /dev/shm
        assert shutil.disk_usage("/dev/shm").total <= 1 << 20
        print(json.dumps({"idle": shm(0), "busy": shm(2)}))
    elif sys.argv[1] == "ddp":
        print(json.dumps(ddp(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        print(json.dumps(oom()))
