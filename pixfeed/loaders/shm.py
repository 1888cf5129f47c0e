"""Will the batches in flight fit in shared memory, and in the open-file limit?

Worker processes hand batches to the training process through ``/dev/shm``
(with either of torch's sharing strategies: ``file_system`` only names the
memory by file instead of passing a descriptor).  Docker gives containers
64 MiB there by default, and a full ``/dev/shm`` fails workers mid-epoch.
``make_loader`` estimates the bytes in flight (batch bytes x prefetch_factor x
workers) and compares them with ``SHM_FRACTION`` of the free space:

1. when they do not fit, it lowers ``prefetch_factor`` until they do (not below 1);
2. when even one batch per worker does not fit, it reads in the training
   process (``num_workers=0``, no shared memory at all) and warns once with the
   fix; when the caller asked for workers (``num_workers=N``), it raises
   ``SharedMemoryError`` instead, naming the free space, the need and the fix
   (``docker run --shm-size=...`` or ``--ipc=host``).

The ``file_system`` strategy is for what it is for: the ``file_descriptor``
default holds one open file per batch tensor in flight, so ``file_system`` is
chosen when the open-file limit (``ulimit -n``) is below ``FDS_PER_BATCH`` per
batch in flight plus ``FD_RESERVE`` for everything else.
"""
from __future__ import annotations

import math
import resource
import shutil
from typing import Dict, Optional, Tuple

import torch.multiprocessing as mp

from pixfeed.console.warn import warn_caller
from pixfeed.errors import SharedMemoryError

SHM_DIR = "/dev/shm"
SHM_FRACTION = 0.5  # leave half of the free space to everything else
FDS_PER_BATCH = 8  # images, labels and room for a few more fields
FD_RESERVE = 256  # files the training process keeps open besides batches
_warned = False


def shm_free_bytes(path: str = SHM_DIR) -> int:
    try:
        return shutil.disk_usage(path).free
    except OSError:  # no /dev/shm (macOS): nothing to check against
        return 2**62


def fit_prefetch(batch_bytes: int, workers: int, prefetch: int, free: int) -> int:
    """Largest prefetch <= ``prefetch`` whose bytes in flight fit; 0 if none does."""
    budget = int(free * SHM_FRACTION)
    return min(prefetch, budget // max(1, batch_bytes * workers))


def size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def shortage(batch_bytes: int, workers: int, free: int) -> str:
    """What does not fit, and the fixes."""
    need = batch_bytes * workers
    gib = max(1, math.ceil(need * 4 / SHM_FRACTION / 2**30))  # room for prefetch_factor 4
    return (f"{SHM_DIR} has {size(free)} free, but {workers} worker(s) need {size(need)} for one "
            f"{size(batch_bytes)} batch each (and pixfeed keeps {1 - SHM_FRACTION:.0%} free for the rest). "
            f"Fix: give the container more shared memory (docker run --shm-size={gib}g, or --ipc=host; in "
            "Kubernetes an emptyDir with medium: Memory at /dev/shm), or use num_workers=0 (reads in process, "
            "no shared memory) or smaller batches")


def fit_shared_memory(reasons: Dict[str, str], batch_bytes: int, workers: int, prefetch: int,
                      asked: bool) -> Tuple[int, Optional[int]]:
    """(workers, prefetch_factor) whose batches in flight fit the free shared memory; says why in ``reasons``."""
    free = shm_free_bytes()
    fitted = fit_prefetch(batch_bytes, workers, prefetch, free)
    in_flight = f"{size(batch_bytes * workers * prefetch)} in flight, {size(free)} free in {SHM_DIR}"
    if fitted >= 1:
        lowered = f"lowered from {prefetch} to fit /dev/shm: " if fitted < prefetch else ""
        reasons["prefetch_factor"] += f"; {lowered}{in_flight}"
        return workers, fitted
    if asked:
        raise SharedMemoryError(f"num_workers={workers}: {shortage(batch_bytes, workers, free)}")
    _warn_once(f"pixfeed: reading in the training process (num_workers=0): {shortage(batch_bytes, workers, free)}")
    reasons["num_workers"] = f"one batch per worker does not fit: {size(free)} free in {SHM_DIR}"
    reasons["prefetch_factor"] = "no workers"
    return 0, None


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warn_caller(message, RuntimeWarning)


def choose_strategy(workers: int, prefetch: int) -> Tuple[str, str]:
    """(sharing strategy, reason): ``file_system`` only when the open-file limit is too low."""
    current = mp.get_sharing_strategy()
    if not workers:
        return current, "no workers"
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    need = workers * prefetch * FDS_PER_BATCH + FD_RESERVE
    if limit == resource.RLIM_INFINITY or limit >= need or "file_system" not in mp.get_all_sharing_strategies():
        return current, f"open-file limit {limit} is enough"
    return "file_system", f"open-file limit {limit} < {need}: tensors shared by name, not by descriptor"
