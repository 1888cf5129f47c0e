"""Datasets against memory: where epochs are served from, read-ahead and order (``make_loader``'s plan).

* ``storage``: ``"page cache"`` when the dataset's bytes (its manifest's files)
  fit in ``CACHE_FRACTION`` of the page cache this process may keep
  (``pixfeed.machine.memory.fits_in_page_cache``: ``MemAvailable``, or a cgroup's limit
  minus its non-cache usage when smaller); ``"disk"`` otherwise: every epoch
  reads from storage (the readers then read without mapping the files), and
  ``order="quasi_random"`` may read it faster where random reads are slow.
* ``io_ahead``: bytes of records requested from storage ahead of the reader
  (``readahead.Hinter``), default ``min(MAX_IO_AHEAD, room // 8)``; 0 (off) for
  datasets without record byte ranges.  The first epoch of a dataset that fits
  is cold too, so it is on in both cases; on cached pages a request is a lookup.
* ``io_depth``: how the records ahead are requested.  0:
  ``posix_fadvise(WILLNEED)``, the kernel queues each top-up's reads at once;
  N: read by N threads at once (``storage.depth.Reads``: ``os.preadv`` into
  reusable buffers, N requests in flight, the page cache the hand-off to the
  readers).  By default 0 where the kernel honours WILLNEED (asked once per
  device and process: ``storage.depth.willneed_honoured`` advises a few pages
  not cached and asks ``mincore`` whether they came), as it queues deeper than
  threads and copies nothing: cold shuffled epochs of 0.92 GiB of pixels on the
  2-CPU dev machine, 1.67 GB/s against 1.28 with 16 threads, and ahead in every
  other row of ``bench_bigdata.py`` (quasi-random, LMDB, HDF5, under a cgroup
  limit); the pool where it is ignored (some FUSE and ZFS mounts), 16 reads in
  flight (2 on a rotational disk: ``choose_depth``).
* ``drop_behind``: for a dataset on ``disk``, read-ahead also drops the pages of
  records read well behind the reader (a cgroup at its limit would otherwise
  reclaim a page for each page read).
* ``order``: ``"random"`` (the full shuffle) or ``"quasi_random"``
  (``order.py``), whose chunk and window sizes come from ``io_ahead``; the
  default ``"auto"`` is the full shuffle here, and ``fetchplan.attach`` makes it
  quasi-random for a bucket dataset read through a chunk cache smaller than it,
  where a full shuffle fetches chunks many times over (the forecasts of both
  orders in the reason).
"""
from __future__ import annotations

from typing import Any, Optional

from torch.utils.data import IterableDataset

from pixfeed.errors import OptionError, require_int
from pixfeed.loaders.order import ORDERS, quasi_sizes
from pixfeed.machine.memory import CACHE_FRACTION, fits_in_page_cache, page_cache_room
from pixfeed.storage.depth import choose_depth, choose_io_depth as default_io_depth
from pixfeed.storage.pagecache import Extents

MAX_IO_AHEAD = 256 << 20
MIN_IO_AHEAD = 1 << 20
MAX_IO_DEPTH = 256  # threads reading ahead at most (a deep NVMe queue is full well below)


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def dataset_bytes(dataset: Any) -> Optional[int]:
    """Bytes of a pixfeed dataset's files (from its manifest), else None."""
    manifest = getattr(dataset, "manifest", None)
    if not isinstance(manifest, dict) or not manifest.get("files"):
        return None
    return sum(meta["bytes"] for meta in manifest["files"].values())


def choose_storage(nbytes: Optional[int], room: Optional[int]) -> tuple:
    if nbytes is None or room is None:
        return "unknown", "dataset size or free memory unknown"
    if fits_in_page_cache(nbytes, room):
        return "page cache", f"dataset {mib(nbytes)} fits in {mib(room)} of page cache this process may keep"
    return "disk", (f"dataset {mib(nbytes)} > {CACHE_FRACTION:.0%} of {mib(room)} this process may cache: every "
                    f"epoch reads from storage, ahead in the sampler's order (order='quasi_random' for slow random reads)")


def choose_io_ahead(requested: Any, extents: Optional[Extents], room: Optional[int]) -> tuple:
    if requested != "auto":
        budget = 0 if requested is False else require_int("io_ahead", requested, 0, auto=True)
        if budget and extents is None:
            raise OptionError(f"io_ahead={requested!r}: this dataset gives no record byte ranges "
                              "(record_extents), so there is nothing to read ahead; leave io_ahead out")
        return budget, "set by caller"
    if extents is None:
        return 0, "the dataset gives no record byte ranges (record_extents)"
    budget = MAX_IO_AHEAD if room is None else max(MIN_IO_AHEAD, min(MAX_IO_AHEAD, room // 8))
    return budget, f"records of the next {mib(budget)} of the order requested from storage (min of " \
                   f"{mib(MAX_IO_AHEAD)} and 1/8 of the page cache room)"


def choose_io_depth(requested: Any, extents: Optional[Extents], budget: int, storage: str = "page_cache",
                    order: str = "random") -> tuple:
    """(reads in flight for read-ahead, reason); 0: advised with ``posix_fadvise(WILLNEED)`` instead.  By default
    WILLNEED where the kernel honours it (``storage.depth.choose_io_depth``), but threads for a dataset larger
    than the page cache this process may keep (``storage == "disk"``): they read only what is asked, when it is
    asked, and in a tight cgroup the pages they bring in are read before reclaim takes them; and threads in
    quasi-random order, whose runs of consecutive records they read as few large pieces."""
    if requested != "auto":
        depth = 0 if requested is False else require_int("io_depth", requested, 0, auto=True)
        if depth > MAX_IO_DEPTH:
            raise OptionError(f"io_depth={depth}: at most {MAX_IO_DEPTH} reads in flight (one thread each)")
        if depth and not budget:
            raise OptionError(f"io_depth={depth}: there is no read-ahead to read with depth (io_ahead=0, a "
                              "caller's sampler, or a dataset without record byte ranges); leave io_depth out")
        return depth, "set by caller" + ("" if depth else ": read-ahead asks the kernel (posix_fadvise WILLNEED)")
    if not budget or extents is None:
        return 0, "no read-ahead (io_ahead)"
    if storage != "disk" and order != "quasi_random":
        return default_io_depth(extents.path)
    depth, kind = choose_depth(extents.path)  # threads whatever WILLNEED does here: no probe of it needed
    if storage == "disk":
        return depth, f"the dataset is larger than the page cache this process may keep: {depth} threads read " \
                      f"the records ahead ({kind}): {LIMITED_WHY}"
    return depth, f"order='quasi_random': {depth} threads read the runs of records ahead ({kind}): {QUASI_WHY}"


LIMITED_WHY = ("in cgroups of half and a quarter of 0.92 GiB of 256x256 pixels on the 2-CPU dev machine, second "
               "shuffled epochs read at 0.92-1.14 and 0.79 of a cold sequential read with depth with 16 threads, "
               "against 0.93-1.08 and 0.48 with WILLNEED, whose pages a tight cgroup reclaims before they are read "
               "(bench_bigdata.py --cold-only --cgroup-fraction 0.5 / 0.25)")
QUASI_WHY = ("cold quasi-random epochs of 0.92 GiB of 256x256 pixels on the 2-CPU dev machine read at 0.92-1.24 of a "
             "sequential read with 16 reads in flight with 16 threads, against 0.80-1.06 with WILLNEED "
             "(bench_bigdata.py --cold-only, eight runs)")


def choose_order(order: str, shuffle: Optional[bool], budget: int, extents: Optional[Extents]) -> tuple:
    """(order, (chunk, window) or None, reason)."""
    if order not in ORDERS:
        raise OptionError(f"order={order!r}: expected one of {', '.join(map(repr, ORDERS))}")
    if order in ("random", "auto"):
        reason = "full shuffle" if shuffle is not False else "shuffle=False: record order"
        return "random", None, reason + (" (order='auto': the dataset is not read through a chunk cache smaller "
                                         "than it)" if order == "auto" and shuffle is not False else "")
    if shuffle is False:
        raise OptionError("order='quasi_random' shuffles; it cannot be combined with shuffle=False")
    if not budget or extents is None:
        raise OptionError("order='quasi_random' needs a pixfeed map-style dataset with record byte ranges and "
                          "io_ahead > 0 (its chunks are sized from the read-ahead budget)")
    chunk, window = quasi_sizes(budget, extents.mean_length)
    return order, (chunk, window), f"shuffled chunks of {chunk} consecutive records, shuffled within " \
                                   f"windows of {window} records"


def own_order(dataset: Any, shuffle: Optional[bool]) -> str:
    """What an iterable dataset's order is: it orders its own samples (no sampler, no full shuffle)."""
    shuffled = getattr(dataset, "shuffle", None) if shuffle is None else shuffle
    buffer = getattr(dataset, "buffer", None)
    if shuffled is False:
        return "the dataset's own order: its stream as stored (shuffle=False)"
    if shuffled and buffer is not None:
        mixed = f", then a buffer of {buffer} samples per worker" if buffer > 1 else ", no buffer"
        return f"the dataset's own order: shards shuffled each epoch{mixed} (no full shuffle; buffer= widens it)"
    return "the dataset's own order (an iterable dataset orders its samples itself)"


def plan_memory(plan: Any, dataset: Any, extents: Optional[Extents], io_ahead: Any, order: str,
                shuffle: Optional[bool], batch_size: int, io_depth: Any = "auto") -> None:
    """Fill the plan's ``storage``, ``io_ahead``, ``io_depth``, ``order``, ``quasi`` and ``drop_behind``."""
    room = page_cache_room()
    plan.storage, plan.reasons["storage"] = choose_storage(dataset_bytes(dataset), room)
    plan.io_ahead, plan.reasons["io_ahead"] = choose_io_ahead(io_ahead, extents, room)
    plan.order, plan.quasi, plan.reasons["order"] = choose_order(order, shuffle, plan.io_ahead, extents)
    plan.io_depth, plan.reasons["io_depth"] = choose_io_depth(io_depth, extents, plan.io_ahead, plan.storage,
                                                              plan.order)
    if isinstance(dataset, IterableDataset) and plan.order == "random":
        plan.reasons["order"] = own_order(dataset, shuffle)
    plan.order_asked = order
    plan.drop_behind = drop_behind(plan, batch_size)
    if plan.drop_behind is not None and plan.io_ahead:
        plan.reasons["io_ahead"] += f"; pages of records {plan.drop_behind} positions behind are dropped"


def drop_behind(plan: Any, batch_size: int) -> Optional[int]:
    """Positions behind the sampler whose pages read-ahead drops: None (keep them) when the dataset
    fits; else every batch the DataLoader may hold in flight (per worker ``prefetch_factor``; in
    process the reader thread's 2) and two more, so no page is dropped before it is read; in process
    without a reader thread one batch, the one being read (the guarded reader reads a batch per request,
    so every record drawn before it is read).  No more than that: pages kept behind take the room
    read-ahead needs (in a cgroup of half 0.92 GiB of 256x256 pixels, in process, keeping 4 batches of 256
    behind read second epochs at 0.76-0.96 of the sequential read against 1.06-1.13 keeping 2; in a cgroup of
    a quarter, 2 batches against 1: 0.59-0.67 against 0.69-0.75 with WILLNEED, 0.34-0.35 against 0.77-0.78
    with threads, quasi-random; bench_bigdata's pack, one process per cgroup)."""
    if plan.storage != "disk":
        return None
    if not plan.num_workers and not plan.read_ahead:
        return batch_size
    in_flight = plan.num_workers * (plan.prefetch_factor or 0) if plan.num_workers else 2
    return (in_flight + 2) * batch_size
