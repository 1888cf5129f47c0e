"""Will the batches in flight fit in shared memory?

Worker processes hand batches to the training process through ``/dev/shm``.
Docker gives containers 64 MiB there by default, and a full ``/dev/shm``
kills workers with a bus error mid-epoch.  ``make_loader`` estimates the bytes
in flight (batch bytes x prefetch_factor x workers) and compares them with
``SHM_FRACTION`` of the free space:

1. when they do not fit, it lowers ``prefetch_factor`` until they do (not below 1);
2. when even one batch per worker does not fit, it switches torch to the
   ``file_system`` sharing strategy (no file descriptor per tensor, no fd-limit
   failures on top of the shortage) and warns once with the real fix: more
   shared memory (``docker run --shm-size=...``), fewer workers or smaller batches.
"""
from __future__ import annotations

import shutil
import warnings
from typing import Tuple

import torch.multiprocessing as mp

SHM_DIR = "/dev/shm"
SHM_FRACTION = 0.5  # leave half of the free space to everything else
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


def fall_back_to_file_system(in_flight: int, free: int) -> None:
    """Switch the sharing strategy and warn, once per process."""
    global _warned
    mp.set_sharing_strategy("file_system")
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"pixfeed: about {in_flight / 2**20:.0f} MiB of batches would be in flight but "
        f"{SHM_DIR} has {free / 2**20:.0f} MiB free; switched torch.multiprocessing to the "
        "'file_system' sharing strategy. Fix: give the container more shared memory "
        "(docker run --shm-size=8g, or a larger emptyDir medium: Memory in Kubernetes), "
        "or use fewer workers or smaller batches.",
        RuntimeWarning,
        stacklevel=3,
    )


def plan_sharing(batch_bytes: int, workers: int, prefetch: int) -> Tuple[int, str, str]:
    """(prefetch_factor, sharing strategy, reason) that fit the free shared memory."""
    free = shm_free_bytes()
    fitted = fit_prefetch(batch_bytes, workers, prefetch, free)
    current = mp.get_sharing_strategy()
    in_flight = f"{batch_bytes * workers * prefetch >> 20} MiB in flight"
    if fitted == prefetch:
        return prefetch, current, f"{in_flight}, {free >> 20} MiB free in {SHM_DIR}"
    if fitted >= 1:
        return fitted, current, f"prefetch lowered from {prefetch}: {in_flight}, {free >> 20} MiB free"
    return 1, "file_system", f"one batch per worker exceeds {SHM_FRACTION:.0%} of {free >> 20} MiB free"
