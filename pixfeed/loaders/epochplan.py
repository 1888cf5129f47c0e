"""Choices made when each epoch starts: read-ahead hints and the in-process reader thread.

Both pay only while reads may wait on storage, and on a warm local dataset
they cost more than the read (stored pixels, warm, in process: the hint thread
and the per-batch hand-off to a reader thread took a third of the time).  So
``decide`` asks the kernel, once per epoch, how much of the dataset's files is
in the page cache (``pagecache.resident_fraction``: ``mincore`` over 64 evenly
spaced runs of 16 pages per file, well under a millisecond; over every page it
took ~20 ms a GB, a fifth of a warm epoch of stored pixels; a page missed by
the sample costs one read that was not hinted) and records each choice with its
reason in ``loader.pixfeed_plan``:

* ``hints`` (``readahead.Hinter``): on for a dataset larger than the page
  cache, and while any page of its files is not resident (a first epoch, pages
  reclaimed since); off when every page is: there is nothing to read ahead.
  A chunk-cached bucket dataset always fetches ahead (``fetcher.py``).
* ``reader_thread`` (``guard.Guarded``, in process only): off where a read
  cannot wait on storage: a dataset with record byte ranges (pixfeed's files),
  no chunk cache, no ``transform`` (user code may wait on anything), on a local
  file system, with every page resident.  The training loop then calls the
  reader itself.  Otherwise each batch is read in a helper thread, so that
  ``stall_timeout`` bounds the wait.  Workers are watched by ``watchdog.py``.

``prepare`` (from ``make_loader``) records the files and what, whatever the
page cache holds, keeps the reader thread on.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from pixfeed.loaders.readahead import Hinter
from pixfeed.storage.pagecache import Extents, resident_fraction

REMOTE_FILE_SYSTEMS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre",
                                 "gpfs", "beegfs", "afs", "ncpfs", "davfs"})
PER_EPOCH = "decided when each epoch starts"
SAMPLED_RUNS = 64  # runs of pages per file asked of mincore (every page costs ~20 ms a GB, each epoch)


def file_system(path: Path) -> Optional[str]:
    """The type of the file system holding ``path`` (the longest mount point above it), or None."""
    target, best, kind = os.path.realpath(path), "", None
    try:
        with open("/proc/self/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind


def may_block(dataset: Any, extents: Optional[Extents]) -> Optional[str]:
    """Why a read of ``dataset`` may wait on something other than a local page cache, or None."""
    if extents is None:
        return "the dataset gives no record byte ranges, so its reads may wait on anything"
    if getattr(dataset, "chunks", None) is not None:
        return "records come from a bucket through the chunk cache"
    if getattr(dataset, "transform", None) is not None:
        return "a transform runs code that may wait on anything"
    kind = file_system(Path(extents.path))
    if kind is None or kind in REMOTE_FILE_SYSTEMS or kind.startswith("fuse"):
        return f"its files are on a {kind or 'unknown'} file system, whose reads may wait on a server"
    return None


def prepare(plan: Any, dataset: Any, extents: Optional[Extents]) -> None:
    if callable(getattr(dataset, "plan_sources", None)):  # a mixture (pixfeed.mixing): its sources' files
        each = [(s, s.record_extents() if callable(getattr(s, "record_extents", None)) else None)
                for s in dataset.sources]
        plan.files = [f for _, e in each for f in _files(e)]
        plan.blocking = next((why for why in (may_block(s, e) for s, e in each) if why), None)
    else:
        plan.files, plan.blocking = _files(extents), may_block(dataset, extents)
    plan.reasons["hints"] = plan.reasons["reader_thread"] = PER_EPOCH


def _files(extents: Optional[Extents]) -> list:
    return [] if extents is None else [Path(extents.path), *map(Path, extents.whole)]


def decide(loader: Any) -> None:
    """Turn the hints and the reader thread on or off for the epoch about to start (module docstring)."""
    plan, hinter = loader.pixfeed_plan, getattr(loader.sampler, "hints", None)
    asked = isinstance(hinter, Hinter) or (not loader.num_workers and plan.blocking is None)
    resident = resident_fraction(plan.files, SAMPLED_RUNS) if asked and plan.files and plan.storage != "disk" else None
    warm = resident is not None and resident >= 1.0
    plan.hints, plan.reasons["hints"] = _hints(plan, hinter, resident, warm)
    if isinstance(hinter, Hinter):
        hinter.active = plan.hints
    plan.reader_thread, plan.reasons["reader_thread"] = _reader_thread(plan, loader.num_workers, resident, warm)


def _cached(plan: Any, resident: Optional[float]) -> str:
    if plan.storage == "disk":
        return "dataset larger than the page cache"
    return "page cache residency unknown" if resident is None else f"{min(resident, 0.999):.1%} of its pages in the page cache"


def _hints(plan: Any, hinter: Any, resident: Optional[float], warm: bool) -> tuple:
    if hinter is None:
        return False, "no read-ahead (io_ahead)"
    if not isinstance(hinter, Hinter):
        return True, "chunks fetched ahead in the sampler's order (storage)"
    if warm:
        return False, "every page of the dataset's files in the page cache: nothing to read ahead"
    return True, f"{_cached(plan, resident)}: the records ahead are requested from storage"


def _reader_thread(plan: Any, workers: int, resident: Optional[float], warm: bool) -> tuple:
    if workers:
        return False, "workers read; the watchdog bounds each wait on them"
    bound = "each batch is read in a helper thread so that stall_timeout bounds the wait"
    if plan.blocking is not None:
        return True, f"{plan.blocking}: {bound}"
    if warm:
        return False, "warm local dataset (every page in the page cache): a read cannot wait on storage"
    return True, f"{_cached(plan, resident)}: a read may wait on storage, so {bound}"

