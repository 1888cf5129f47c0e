"""The machine's limits, measured in the same run as the formats they bound.

* ``memcopy``: one process copying a large NumPy array (bytes copied per
  second, best of several): the limit for formats that store pixels.
* ``decode``: ``pixfeed.image.decode.decode`` + resize + center crop over the
  source's encoded bytes already in memory, split over N forked processes that
  start together; no dataset, loader or IPC: the limit for encoded formats
  (and, with the pack's process count, for packing pixels).
* ``file_copy``: ``shutil.copyfile`` of every source file into a folder
  beside the packs: the limit for packing encoded bytes.

Each row measures its ceiling just before and just after it runs and keeps
the higher (``bracket``), so the ratio compares figures taken under the same
machine load.
"""
from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import time
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from ..image.decode import Size, decode

MEMCOPY_BYTES = 128 << 20  # far beyond the CPU caches, small enough to allocate quickly
REPEATS = 5


def rate(measurement: dict) -> float:
    """The figure a ceiling is compared by: images/s where it has one, else bytes/s."""
    return measurement.get("images_per_s", measurement.get("bytes_per_s", 0.0))


def bracket(before: dict, after: dict) -> dict:
    """The higher of a ceiling measured before and after a row, with both samples kept.

    Other load on the machine only ever lowers a measured limit, so the
    higher sample is the better estimate; the two samples show the noise.
    """
    best = max(before, after, key=rate)
    return {**best, "samples": [round(rate(before), 1), round(rate(after), 1)]}


def memcopy(nbytes: int = MEMCOPY_BYTES, repeats: int = REPEATS) -> dict:
    """Best single-process copy rate of an ``nbytes`` NumPy array."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return {"bytes_per_s": nbytes / best, "bytes": nbytes}


def _decode_share(share: Sequence[bytes], size: Size, exact: bool, barrier, results) -> None:
    import torch

    torch.set_num_threads(1)  # as in DataLoader workers: a forked child never gets its parent's OpenMP threads
    barrier.wait()
    start, cpu = time.perf_counter(), time.process_time()
    for data in share:
        decode(data, size=size, crop="center", exact=exact)
    results.put((time.perf_counter() - start, time.process_time() - cpu))


def decode_rate(blobs: List[bytes], size: Size, processes: int, exact: bool = True) -> dict:
    """Images/s of decoding ``blobs`` (in memory) at ``size`` in ``processes`` forked processes.

    ``exact`` picks decode's path as the row being bounded does: Pillow
    (packing, the folder baselines) or the fast path (datasets' default).
    """
    processes = max(1, min(processes, len(blobs)))
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(processes), ctx.SimpleQueue()
    procs = [ctx.Process(target=_decode_share, args=(blobs[i::processes], size, exact, barrier, results), daemon=True)
             for i in range(processes)]
    for p in procs:
        p.start()
    times: List[Tuple[float, float]] = [results.get() for _ in procs]
    for p in procs:
        p.join()
    wall = max(t for t, _ in times)
    return {"images_per_s": len(blobs) / wall, "processes": processes,
            "cpu_ms_per_image": 1000 * sum(c for _, c in times) / len(blobs)}


def file_copy(root: Path, paths: Sequence[str], work: Path) -> dict:
    """Rate of copying the source files (``paths`` relative to ``root``) into a folder under ``work``."""
    dst = Path(tempfile.mkdtemp(prefix="copy-", dir=work))
    try:
        start, nbytes = time.perf_counter(), 0
        for rel in paths:
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / rel, target)
            nbytes += target.stat().st_size
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(dst, ignore_errors=True)
    return {"bytes_per_s": nbytes / seconds, "images_per_s": len(paths) / seconds, "bytes": nbytes}
