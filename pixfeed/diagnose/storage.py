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

``check_epoch`` forecasts a cold shuffled epoch of a pixfeed map-style
dataset: records drawn at random (``SAMPLE_BYTES`` of them, at most
``limit``), their byte ranges looked up, the data file evicted, then read one
by one in the drawn order with ``pread`` while they are requested ahead as
``make_loader``'s read-ahead requests them (``io_depth`` as it would choose:
``posix_fadvise(WILLNEED)``, or read by that many threads; in file order per
``TOP_UP`` of records), for at most ``EPOCH_SECONDS``; against the same file
read in order with ``SOLID_DEPTH`` reads in flight (its first ``limit`` bytes,
cold).  The rate is a forecast of the storage's part only: decoding and the
training step come on top.

``check_cache`` compares all the files' bytes with the page cache this process
may keep (``pixfeed.machine.memory.page_cache_room``), by ``make_loader``'s own rule
(``loaders/cacheplan.py``): epochs after the first are served from the page
cache, or every epoch from the disk.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from pixfeed.storage.bounded import open_regular
from pixfeed.storage.depth import SOLID_DEPTH, Reads, choose_io_depth, sequential_rate
from pixfeed.storage.pagecache import CHUNK, evict, read_rate, will_need
from pixfeed.diagnose.finding import INFO, OK, WARN, Finding, size
from pixfeed.loaders.cacheplan import choose_storage
from pixfeed.errors import PixfeedError
from pixfeed.manifest import read_manifest

READ_LIMIT = 256 * 2**20
SLOW = 200e6  # bytes/s below which storage, not decoding, is likely to cap a GPU
ENOUGH = 16 * 2**20  # below this many bytes, opening files dominates and the rate says little
STILL_CACHED = 0.5  # resident fraction after eviction above which "cold" was not cold
SPIKE_S, SPIKE_RATIO = 0.5, 10  # a single read slower than both this and 10x the average is a latency spike
EPOCH_SECONDS = 2.0  # check_epoch's shuffled sample reads for at most this long
SAMPLE_BYTES = 128 << 20  # records drawn for it (at most the read limit)
TOP_UP = 32 << 20  # records sorted and merged together, as read-ahead tops up an eighth of its 256 MiB
SLOW_EPOCH = 0.5  # a shuffled epoch below this fraction of the sequential rate: suggest quasi-random order


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


def _extents(path: Path):
    """The record byte ranges of the pixfeed map-style dataset at ``path``, or None."""
    from pixfeed.datasets import open_dataset  # a reader: only for a dataset doctor is pointed at

    try:
        dataset = open_dataset(path)
    except (PixfeedError, OSError, ValueError):
        return None
    extents = dataset.record_extents() if callable(getattr(dataset, "record_extents", None)) else None
    if extents is None or not extents.count or not Path(extents.path).is_file():
        return None
    return extents


def shuffled_sample(extents, depth: int, nbytes: int, seconds: float, seed: int = 0) -> dict:
    """Bytes/s of a reader ``pread``-ing records drawn at random (``nbytes`` of them) from the evicted file, one by
    one in the drawn order, while they are requested ahead as read-ahead requests them: read by ``depth``
    threads, or (0) advised with ``posix_fadvise(WILLNEED)``; at most ``seconds``."""
    per_top_up = max(1, int(TOP_UP / max(extents.mean_length, 1.0)))
    count = min(extents.count, max(1, int(nbytes / max(extents.mean_length, 1.0))))
    drawn = np.random.default_rng(seed).choice(extents.count, count, replace=False)
    parts = [extents.of(drawn[k:k + per_top_up]) for k in range(0, count, per_top_up)]  # looked up before timing
    buffer = np.empty(max(int(lengths.max()) for _, lengths in parts), np.uint8)
    evict([Path(extents.path)])
    fd = open_regular(extents.path)
    reads = Reads(extents.path, depth) if depth else None
    got, start = 0, time.perf_counter()
    deadline = time.monotonic() + seconds
    try:
        for starts, lengths in parts:
            if reads is not None:
                reads.add(starts, lengths)
            else:
                will_need(fd, starts, lengths)
        for starts, lengths in parts:
            for offset, length in zip(starts.tolist(), lengths.tolist()):
                if time.monotonic() > deadline:
                    break
                got += os.preadv(fd, [memoryview(buffer)[:length]], offset)
    finally:
        if reads is not None:
            reads.stop()
            reads.close()
        os.close(fd)
    elapsed = max(time.perf_counter() - start, 1e-9)
    return {"bytes": got, "seconds": elapsed, "bytes_per_s": got / elapsed, "records": count}


def check_epoch(path: Path, limit: int = READ_LIMIT, seconds: float = EPOCH_SECONDS) -> Optional[Finding]:
    """A forecast of a cold shuffled epoch's read rate from a measured sample (module docstring), or None when
    ``path`` is not a pixfeed dataset with record byte ranges."""
    extents = _extents(path)
    if extents is None:
        return None
    data = Path(extents.path)
    depth, why = choose_io_depth(data)
    evict([data])
    sequential = sequential_rate([data], SOLID_DEPTH, limit=limit)
    sample = shuffled_sample(extents, depth, min(SAMPLE_BYTES, limit), seconds)
    if not sample["bytes"] or not sequential["bytes"]:
        return Finding("cold epoch", f"{path}: nothing read", "the data file is empty or unreadable", WARN)
    rate, seq = sample["bytes_per_s"], sequential["bytes_per_s"]
    images = rate / max(extents.mean_length, 1.0)
    fraction = rate / seq
    how = f"read by {depth} threads" if depth else "requested with posix_fadvise(WILLNEED)"
    value = (f"a cold shuffled epoch of this dataset would read at about {rate / 1e6:.0f} MB/s ({images:.0f} img/s), "
             f"{fraction:.0%} of the sequential rate ({seq / 1e6:.0f} MB/s with {SOLID_DEPTH} reads in flight)")
    data_out = {"path": str(data), "io_depth": depth, "io_depth_reason": why, "sample_bytes": sample["bytes"],
                "sample_seconds": sample["seconds"], "sample_records": sample["records"], "bytes_per_s": rate,
                "images_per_s": images, "sequential_bytes_per_s": seq, "sequential_bytes": sequential["bytes"],
                "sequential_depth": SOLID_DEPTH, "fraction_of_sequential": fraction,
                "bytes_per_record": extents.mean_length}
    if sequential["bytes"] < ENOUGH:
        return Finding("cold epoch", value, f"only {size(sequential['bytes'])} to read: too little to judge the "
                       "storage", INFO, data_out)
    if fraction < SLOW_EPOCH:
        advice = (f"random reads cost this storage {1 / fraction:.1f}x sequential ones: make_loader(order="
                  "'quasi_random') reads runs of consecutive records; measure with benchmarks/bench_bigdata.py")
        return Finding("cold epoch", value, advice, WARN, data_out)
    return Finding("cold epoch", value, f"the records ahead {how} (make_loader's io_depth={depth})", OK, data_out)


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
