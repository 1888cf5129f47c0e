"""How fast the storage under a dataset reads: sequential reads of its files.

The files are a pixfeed dataset's data files (from its manifest) or, for any
other folder, every file below it; the first of them, up to ``limit`` bytes,
are read in order twice with ``pixfeed.storage.pagecache.read_rate``:

* cold: the files are first evicted from the page cache (``fsync`` +
  ``posix_fadvise(POSIX_FADV_DONTNEED)``).  The kernel may keep pages (tmpfs,
  some overlay or network mounts); ``mincore`` tells how much stayed, and the
  report says so when the cold read was not cold.
* warm: the same bytes from the page cache (what later epochs see when the
  dataset fits in memory).

The slowest single read of the cold pass is kept too: one that took over
``SPIKE_S`` and ``SPIKE_RATIO`` times what the average rate allows is reported
as a latency spike (a network or FUSE mount that pauses), which stalls
training however fast the average is.

``check_cache`` compares all the files' bytes with the page cache this process
may keep (``pixfeed.machine.memory.page_cache_room``), by ``make_loader``'s own rule
(``loaders/cacheplan.py``): epochs after the first are served from the page
cache, or every epoch from the disk.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from pixfeed.storage.pagecache import CHUNK, read_rate
from pixfeed.diagnose.finding import INFO, OK, WARN, Finding, size
from pixfeed.loaders.cacheplan import choose_storage
from pixfeed.errors import PixfeedError
from pixfeed.manifest import read_manifest

READ_LIMIT = 256 * 2**20
SLOW = 200e6  # bytes/s below which storage, not decoding, is likely to cap a GPU
ENOUGH = 16 * 2**20  # below this many bytes, opening files dominates and the rate says little
STILL_CACHED = 0.5  # resident fraction after eviction above which "cold" was not cold
SPIKE_S, SPIKE_RATIO = 0.5, 10  # a single read slower than both this and 10x the average is a latency spike


def data_files(path: Path) -> Tuple[List[Path], Optional[float]]:
    """(files to read, stored bytes per record, or None when ``path`` is not a pixfeed dataset)."""
    try:
        manifest = read_manifest(path)
    except PixfeedError:
        return sorted(p for p in path.rglob("*") if p.is_file()), None
    stored = sum(meta["bytes"] for meta in manifest["files"].values())
    return [path / name for name in manifest["files"]], stored / max(1, manifest["count"])


def head(files: List[Path], limit: int) -> List[Path]:
    """The first files whose sizes add up to ``limit`` bytes (the last one may pass it)."""
    chosen, total = [], 0
    for path in files:
        if total >= limit:
            break
        chosen.append(path)
        total += path.stat().st_size
    return chosen


def check_storage(path: Path, limit: int = READ_LIMIT) -> Finding:
    files, per_record = data_files(path)
    files = head(files, limit)
    cold, warm = read_rate(files, cold=True), read_rate(files, cold=False)
    nbytes = warm["bytes"]
    if not nbytes:
        return Finding("storage", f"{path}: nothing to read", "point doctor at a dataset or an image folder", WARN)
    value = (f"{path}: {cold['bytes_per_s'] / 1e6:.0f} MB/s cold, {warm['bytes_per_s'] / 1e6:.0f} MB/s warm "
             f"({size(nbytes)} in {len(files)} files)")
    data = {"path": str(path), "bytes": nbytes, "files": len(files), "cold_bytes_per_s": cold["bytes_per_s"],
            "warm_bytes_per_s": warm["bytes_per_s"], "cold_resident_fraction": cold["resident_before"],
            "bytes_per_record": per_record, "cold_slowest_read_s": cold["slowest_read_s"]}
    return Finding("storage", value, *_advice(cold["bytes_per_s"], nbytes, per_record, cold["resident_before"],
                                              cold["slowest_read_s"]), data)


def _advice(rate: float, nbytes: int, per_record: Optional[float], resident: Optional[float],
            slowest: float = 0.0) -> Tuple[str, str]:
    notes = []
    spike = slowest > max(SPIKE_S, SPIKE_RATIO * CHUNK / max(rate, 1.0))
    if spike:
        notes.append(f"latency spike: one {CHUNK >> 20} MiB read took {slowest:.1f} s, {SPIKE_RATIO}x more than "
                     "the average rate allows (a network or FUSE mount that pauses?); make_loader raises only "
                     "after stall_timeout (60 s) without any progress, but every pause stalls training")
    slow = rate < SLOW and nbytes >= ENOUGH
    if slow:
        notes.append("slow storage: copy the dataset to local NVMe or RAM" +
                     ("" if per_record else ", or pack it into a few large files (pixfeed pack)"))
    elif nbytes < ENOUGH:
        notes.append(f"only {size(nbytes)} to read: too little to judge the storage")
    if per_record:
        notes.append(f"storage alone caps reading at {rate / per_record:.0f} images/s cold")
    if resident is not None and resident > STILL_CACHED:
        notes.append(f"the cold read was not cold: {resident:.0%} of the pages stayed cached (tmpfs, overlay?)")
    return "; ".join(notes) or "fast enough for sequential reads", WARN if slow or spike else OK


def check_cache(path: Path, room: Optional[int]) -> Finding:
    nbytes = sum(p.stat().st_size for p in data_files(path)[0])
    where, reason = choose_storage(nbytes, room)
    data = {"bytes": nbytes, "page_cache_room": room, "served_from": where}
    value = f"{path}: {size(nbytes)}, page cache room {'?' if room is None else size(room)}: {where}"
    if where == "disk":
        advice = ("read from the disk every epoch: make_loader reads ahead in the sampler's order (io_ahead); on "
                  "storage slow at random reads, make_loader(order='quasi_random'); or add memory, or pack smaller "
                  "(--store encoded --max-side 384)")
        return Finding("dataset vs memory", value, advice, WARN, data)
    if where == "page cache":
        return Finding("dataset vs memory", value, "epochs after the first are served from the page cache (the "
                       "first is read ahead from the disk in the sampler's order)", OK, data)
    return Finding("dataset vs memory", value, reason, INFO, data)
