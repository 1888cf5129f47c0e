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
import os
import queue
import shutil
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ImageDecodeError, PixfeedError
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


def _decode_share(share: Sequence[bytes], names: Sequence[str], size: Size, exact: bool, barrier, results) -> None:
    import torch

    torch.set_num_threads(1)  # as in DataLoader workers: a forked child never gets its parent's OpenMP threads
    try:
        barrier.wait(timeout=60)
        start, cpu = time.perf_counter(), time.process_time()
        for data, name in zip(share, names):
            decode(data, size=size, crop="center", exact=exact, where=name)
    except Exception as e:  # noqa: BLE001 - the parent names it (a child's traceback would hang the bench)
        results.put(str(e) if isinstance(e, PixfeedError) else f"{type(e).__name__}: {e}")
        return
    results.put((time.perf_counter() - start, time.process_time() - cpu))


def decode_rate(blobs: List[bytes], size: Size, processes: int, exact: bool = True,
                names: Optional[Sequence[str]] = None) -> dict:
    """Images/s of decoding ``blobs`` (in memory) at ``size`` in ``processes`` forked processes.

    ``exact`` picks decode's path as the row being bounded does: Pillow
    (packing, the folder baselines) or the fast path (datasets' default).  An image that does not decode
    (``names`` name them) or a process that dies raises ImageDecodeError / PixfeedError, never a hang.
    """
    processes = max(1, min(processes, len(blobs)))
    names = list(names) if names is not None else [f"image {i}" for i in range(len(blobs))]
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_decode_share, args=(blobs[i::processes], names[i::processes], size, exact, barrier,
                                                     results), daemon=True)
             for i in range(processes)]
    for p in procs:
        p.start()
    try:
        times: List[Tuple[float, float]] = [_result(results, procs) for _ in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    wall = max(t for t, _ in times)
    return {"images_per_s": len(blobs) / wall, "processes": processes,
            "cpu_ms_per_image": 1000 * sum(c for _, c in times) / len(blobs)}


def _result(results, procs) -> Tuple[float, float]:
    """One process's (wall, cpu) seconds; its error raised, naming the image; a dead process an error."""
    while True:
        try:
            got = results.get(timeout=1.0)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise PixfeedError(f"bench: a decode process died (exit code {dead[0]}) while measuring the decode "
                                   "ceiling") from None
            continue
        if isinstance(got, str):
            raise ImageDecodeError(f"{got}; bench decodes every source image: remove it, or pack with --on-error "
                                   "skip and bench the packed copy")
        return got


def file_copy(root: Path, paths: Sequence[str], work: Path) -> dict:
    """Rate of copying the source files (``paths`` relative to ``root``) into a folder under ``work``.
    The copies are named by their number (``00000007.jpg``), never by the source's path: a path from an
    index (``../x``) must not choose where a copy is written."""
    dst = Path(tempfile.mkdtemp(prefix="copy-", dir=work))
    try:
        start, nbytes = time.perf_counter(), 0
        for n, rel in enumerate(paths):
            target = dst / f"{n:08d}{os.path.splitext(rel)[1][:8]}"
            shutil.copyfile(root / rel, target)
            nbytes += target.stat().st_size
        seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(dst, ignore_errors=True)
    return {"bytes_per_s": nbytes / seconds, "images_per_s": len(paths) / seconds, "bytes": nbytes}
