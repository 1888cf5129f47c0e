"""What ``make_loader`` chose and why: the rules for every "auto" option.

* ``path``: ``"batch"`` when the dataset offers ``get_batch`` and a
  ``fixed_shape`` (one gathered read per batch, see ``batch.py``);
  ``"iterable"`` for an ``IterableDataset``; else ``"samples"``, torch's own
  path (one ``__getitems__`` call per batch when the dataset has it, then collate).
* ``num_workers``: 0 on the batch path when the dataset is not ``cpu_bound``:
  reading is a memory copy, and handing it over through shared memory costs
  more than the copy (1,000 images of 224x224 on 2 cores: 14,550 images/s in
  process, 1,919 images/s with 2 workers: ``HAND_OFF_BYTES_PER_S``).  On the
  iterable path (a WebDataset of stored pixels) a sample costs more than its
  copy (walking the tar, parsing its members, checking its hash), so what it
  costs is measured (``probe.read_seconds``, in a throwaway process) and
  workers are used, as for decoding, when it costs more than handing the
  sample over (540 WebDataset samples at 224: 719 images/s in process, 1,615
  with 2 workers); 0 when it costs less or cannot be measured.  Otherwise one worker per usable
  CPU (``cpus.available_cpus``, which honours affinity and cgroup quotas) minus
  one kept for the training process when there are three or more (with two,
  both decode: leaving one idle halves the decode rate of an input-bound job,
  and the training loop mostly waits), none on a single CPU, and never more
  workers than batches one rank reads per epoch.
* ``decode_threads``: with no workers (asked for, one CPU, or too little shared
  memory), a batch of encoded images decodes on one thread per usable CPU in
  the training process (``pixfeed.image.pool``: the decoders and torch's resize
  release the GIL; 500 ImageNet JPEGs at 224 on 2 CPUs: 1.75x one thread, level
  with 2 workers); 1 in each worker.
* ``training_threads``: with workers, torch's intra-op threads in the training
  process are capped while batches are read at the CPUs the workers leave
  (``threads.py``: its OpenMP threads spin-wait on CPUs the workers decode on),
  at least 1; left alone where torch already uses no more, where its pool is
  not OpenMP's (the native pool's idle threads block), or with
  ``training_threads=None``.
* ``read_ahead``: on for in-process reads when CUDA is available, else off
  unless asked for.  ``read_ahead=True`` reads the next batch in a thread.
  With CUDA the training thread is busy launching a fast model's kernels, so an
  in-process read there is not overlapped with the GPU after all: ResNet-18 on an
  H200 fed stored pixels read in process got 0.91 of its appetite with the
  reader thread and 0.69 without (issue #37).  Without CUDA the steps run on the
  same CPUs as the reads, and a reader thread competing for the GIL made epochs
  erratic (7k to 53k images/s for the same 500 images), so it stays off there
  unless asked for (it pays when every step blocks: a loop that calls
  ``loss.item()``, or a CPU step that releases the GIL: ``loader_paths.py
  --step-ms 3``, 1.3x); workers read ahead anyway.
* ``device``, ``decode_on`` (``make_loader(device=...)``, ``device.py``): where
  batches go, and where encoded images decode: on the GPU (nvImageCodec, about
  ``GPU_DECODE_RATE`` full-size ImageNet JPEGs/s, or the device stage's host
  thread's rate where that is lower: ``device_rate``) when the machine's usable CPUs
  decode fewer (about ``CPU_DECODE_RATE`` a core), else in CPU workers whose
  batches are copied; stored pixels are cropped and flipped on the device.
* ``hints``, ``reader_thread`` (read-ahead hints and the in-process reader's
  helper thread): decided when each epoch starts, from the page cache
  (``epochplan.py``); ``seeding``: ``seeding.py``.
* ``pin_memory``: when CUDA is available.
* ``persistent_workers``: whenever there are workers, except for datasets with
  ``set_epoch`` that keep the epoch in a plain attribute, which the copies in
  persistent workers would never see (pixfeed's WebDataset reader keeps it in
  shared memory: ``epoch_in_shared_memory``).
* ``stall_timeout``: seconds a reader may make no progress at all (no CPU
  time, no byte read, no page fault) before the loader raises; 60 by default,
  ample for any single read of a slow disk (``watchdog.py``).
* ``storage``, ``io_ahead``, ``io_depth``, ``order``: the dataset against the
  memory this process may use, read-ahead in the sampler's order and the reads
  it keeps in flight, and the quasi-random order for datasets larger than
  memory (``cacheplan.py``).
* ``memory_format``: the layout of a batch's images, channels_last by default
  (the stored HWC pixels in one copy; what convolutions on GPUs prefer), or
  contiguous (``collate.py``).
* ``sampler``, ``collate_fn``: a caller's, passed through; ``check_sampler``
  refuses by name what the loader then cannot honour and ``user_sampler``
  says what it no longer guarantees (order, read-ahead, resume, the split).
* ``on_error``, ``skipped``: ``"skip"`` reads on past damaged records
  (``damaged.py``, ``pixfeed.datasets.skips``), counted in ``skipped``.
* ``prefetch_factor``: batches each worker keeps ready,
  ``PREFETCH_BUDGET // (batch bytes x workers)`` clamped to 1..4 (2 when the
  batch size in bytes is unknown), then lowered to fit shared memory (``shm.py``).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch.utils.data import IterableDataset

from pixfeed.datasets.protocol import epoch_needs_fresh_workers, reads_in_process
from pixfeed.errors import OptionError, require_int
from pixfeed.loaders.batch import supports_batches
from pixfeed.console.words import plural
from pixfeed.machine.world import World

Auto = Union[str, int, bool, None]
Choice = Tuple[Any, str]
PREFETCH_BUDGET = 1 << 30  # bytes of ready batches across all workers
MAX_PREFETCH = 4
CALLER = "set by caller"
HAND_OFF_BYTES_PER_S = 600e6  # a sample's bytes from a worker's shared memory into the training process: 224x224
# stored pixels (mmap) read by 2 workers on 2 busy CPUs, 2,550-5,800 images/s (380-875 MB/s; 13,700 in process)
STALL_TIMEOUT = 60.0  # seconds a reader may go without progress (no CPU time, no byte read) before the loader raises


@dataclass
class LoaderPlan:
    """Every resolved option with the reason; ``print(loader.pixfeed_plan)`` shows it."""

    path: str
    num_workers: int
    read_ahead: bool
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: Optional[int]
    sharing_strategy: str
    world: World
    cpus: int
    batch_bytes: Optional[int]
    decode_threads: int = 1
    training_threads: Optional[int] = None  # torch's threads in the training process while batches are read
    stall_timeout: float = 0.0
    storage: str = "unknown"
    io_ahead: int = 0
    io_depth: int = 0  # reads in flight for read-ahead; 0: posix_fadvise(WILLNEED) (cacheplan.py)
    order: str = "random"
    order_asked: str = "auto"  # what make_loader was given ("auto": fetchplan may choose quasi_random)
    quasi: Optional[Tuple[int, int]] = None
    drop_behind: Optional[int] = None
    fetch: Optional[Dict[str, Any]] = None  # a chunk-cached bucket dataset's fetch plan (fetchplan.py)
    seeding: str = "none"  # how random draws are seeded (seeding.py)
    hints: Optional[bool] = None  # this epoch's read-ahead hints, and its in-process reader thread (epochplan.py)
    reader_thread: Optional[bool] = None
    files: List[Path] = field(default_factory=list)  # whose page-cache residency decides them
    blocking: Optional[str] = None  # why a read may wait on storage whatever is cached, or None
    reasons: Dict[str, str] = field(default_factory=dict)
    device: Optional[str] = None  # where batches go (make_loader's device=), and where images decode (device.py)
    decode_on: Optional[str] = None
    memory_format: str = "channels_last"  # the layout of a batch's images (collate.py)
    sampler: Optional[str] = None  # a caller's sampler= and collate_fn=, by name (check_sampler)
    collate_fn: Optional[str] = None
    on_error: str = "raise"  # a damaged record: raise, or skip it (pixfeed.datasets.skips)
    skips: Any = None  # on_error="skip": the loader's SkipLog

    @property
    def skipped(self) -> Optional[int]:
        """Damaged records skipped so far (on_error="skip"), by this process and its workers."""
        return None if self.skips is None else self.skips.count

    def __str__(self) -> str:
        names = ("device", "decode_on") * (self.device is not None) + (
                 "path", "num_workers", "decode_threads", "training_threads", "read_ahead", "pin_memory",
                 "persistent_workers", "prefetch_factor", "sharing_strategy", "stall_timeout", "storage", "io_ahead",
                 "io_depth", "order", "hints", "reader_thread", "seeding", "memory_format") + \
            ("sampler",) * (self.sampler is not None) + ("collate_fn",) * (self.collate_fn is not None) + \
            ("on_error",) + ("skipped",) * (self.skips is not None)
        rows = [f"  {name:<18} {getattr(self, name)!s:<15} {self.reasons.get(name, '')}" for name in names]
        head = f"pixfeed loader plan (rank {self.world.rank} of {self.world.size}, {self.cpus} usable CPUs):"
        return "\n".join([head, *rows])


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"{name} must be 'auto', True or False, not {value!r}")
    return value


MEMORY_FORMATS = {torch.channels_last: "channels_last", torch.contiguous_format: "contiguous_format"}


def check_memory_format(memory_format: Any) -> torch.memory_format:
    """``memory_format`` if it is one a batch's images can be laid out in, else an OptionError."""
    if not isinstance(memory_format, torch.memory_format) or memory_format not in MEMORY_FORMATS:
        raise OptionError(f"memory_format {memory_format!r}: expected torch.channels_last (the default: the "
                          "layout pixfeed's pixels are stored in, and convolutions on GPUs prefer) or "
                          "torch.contiguous_format (N x C x H x W strides, for .view() and code that needs them)")
    return memory_format


def check_sampler(sampler: Any, collate_fn: Any, dataset: Any, world: World, distributed: Any, shuffle: Any,
                  order: str, io_ahead: Any, memory_format: torch.memory_format) -> None:
    """Refuse, by name, a caller's ``sampler=`` or ``collate_fn=`` with what the loader then cannot honour."""
    if collate_fn is not None:
        if not callable(collate_fn):
            raise OptionError(f"collate_fn {collate_fn!r}: expected a function of a list of samples")
        if memory_format != torch.channels_last:
            raise OptionError("collate_fn and memory_format: a batch is what your collate_fn returns (its samples are "
                              "3 x H x W views of HWC pixels); lay it out there, or leave collate_fn out")
    if sampler is None:
        return
    name = type(sampler).__name__
    if isinstance(dataset, IterableDataset):
        raise OptionError(f"sampler and an iterable dataset ({type(dataset).__name__}): it orders and splits its own "
                          f"samples, so a sampler ({name}) has no indices to give; leave sampler out (shuffle=, seed=)")
    if not callable(getattr(sampler, "__iter__", None)):
        raise OptionError(f"sampler {sampler!r}: expected a torch Sampler (an iterable of dataset indices)")
    for option, value, default in (("shuffle", shuffle, (None, False)), ("order", order, ("auto",))):
        if value not in default:  # shuffle=False says nothing against a sampler, as in torch's DataLoader
            raise OptionError(f"sampler and {option}: {name} decides the order, so {option}={value!r} cannot apply; "
                              f"leave {option} out (or leave sampler out for pixfeed's order)")
    if io_ahead not in ("auto", 0, False):
        raise OptionError(f"sampler and io_ahead: read-ahead requests records in the sampler's known order, and "
                          f"{name}'s is not known in advance; leave io_ahead out")
    if distributed is not False and world.size > 1:
        replicas = getattr(sampler, "num_replicas", None)
        if replicas is None or not hasattr(sampler, "rank"):
            raise OptionError(f"sampler and a world of {world.size} ranks: {name} does not split by rank "
                              f"(no num_replicas and rank), so every rank would read the same samples; wrap it in a "
                              f"DistributedSampler-like sampler, or pass distributed=False if something else splits")
        if replicas != world.size or sampler.rank != world.rank:
            raise OptionError(f"sampler and a world of {world.size} ranks: {name} splits for num_replicas={replicas}, "
                              f"rank={sampler.rank}, but this is rank {world.rank} of {world.size}")


def user_sampler(sampler: Any, collate_fn: Any) -> Tuple[Optional[str], Optional[str], Dict[str, str]]:
    """(sampler, collate_fn, reasons): the plan's rows for a caller's own, saying what pixfeed then cannot
    guarantee."""
    reasons: Dict[str, str] = {}
    shown = None if sampler is None else type(sampler).__name__
    if sampler is not None:
        split = "splits by rank itself" if hasattr(sampler, "num_replicas") else "not split by rank: one process"
        reasons["sampler"] = (f"yours: its order (pixfeed cannot guarantee each sample once per epoch, nor read "
                              f"ahead in it); {split}; set_epoch called each epoch; a resume skips the samples "
                              "already taken in its next iteration, exact only if its order is a function of its "
                              "epoch; random crops are seeded from (seed, epoch, index), so an index drawn twice "
                              "in an epoch gets the same crop")
    name = None if collate_fn is None else getattr(collate_fn, "__name__", type(collate_fn).__name__)
    if collate_fn is not None:
        reasons["collate_fn"] = ("yours: it gets each batch's samples (3 x H x W views of HWC pixels, labels), and "
                                 "its result is the batch as it is (memory_format does not apply)")
    return shown, name, reasons


def choose_on_error(on_error: Any, dataset: Any) -> Choice:
    """What a damaged record does to the epoch (``on_error``), and why."""
    if on_error not in ("raise", "skip"):
        raise OptionError(f"on_error {on_error!r}: expected 'raise' (the default) or 'skip'")
    if on_error == "raise":
        return on_error, "a damaged record raises CorruptDataError naming it (on_error='skip' reads on without it)"
    if isinstance(dataset, IterableDataset):
        if not hasattr(dataset, "skips"):
            raise OptionError(f"on_error='skip' and {type(dataset).__name__}: an iterable dataset reads its own "
                              "stream, which make_loader cannot continue past a failure; skip inside the dataset")
        return on_error, ("a record failing its checksum or decode is left out of the stream, counted and named "
                          "once: the epoch is one sample shorter for each (its last batch may be short)")
    return on_error, ("a record failing its checksum or decode is counted, named once, and the next sound record "
                      "(index + 1, ...) read in its place: batches stay full, the epoch's length exact")


def layout(memory_format: torch.memory_format) -> Choice:
    """The plan's row for the layout of a batch's images."""
    if memory_format == torch.channels_last:
        return "channels_last", ("N x C x H x W with channels_last strides (default): the stored HWC pixels in one "
                                 "copy, the layout convolutions on GPUs prefer; memory_format="
                                 "torch.contiguous_format for plain NCHW strides (.view)")
    return "contiguous_format", "N x C x H x W, contiguous: the transposing copy made where batches are collated"


def choose_path(dataset: Any) -> Choice:
    if isinstance(dataset, IterableDataset):
        return "iterable", "iterable dataset: batches as the dataset yields them"
    if supports_batches(dataset):
        return "batch", "fixed-shape dataset with get_batch: one gathered read per batch"
    return "samples", "per-sample reads, collated (one __getitems__ call per batch when defined)"


def default_workers(cpus: int) -> int:
    """Workers for per-sample CPU work: none on 1 CPU, both of 2, one CPU kept for training from 3 up."""
    return 0 if cpus < 2 else 2 if cpus == 2 else cpus - 1


def measures_reads(requested: Auto, dataset: Any, path: str, cpus: int) -> bool:
    """Whether the worker plan needs what reading a sample costs (``probe.read_seconds``): stored pixels
    read a sample at a time (an iterable dataset), where the per-sample work may cost more than a copy."""
    return requested == "auto" and path == "iterable" and reads_in_process(dataset) and cpus >= 2


def hand_off_seconds(dataset: Any) -> Optional[float]:
    """Seconds handing one sample of ``dataset`` over from a worker costs the training process."""
    shape = getattr(dataset, "fixed_shape", None)
    return None if shape is None else (math.prod(shape) + 8) / HAND_OFF_BYTES_PER_S


def choose_workers(requested: Auto, dataset: Any, path: str, cpus: int, batches: Optional[int],
                   shards: Optional[int] = None, read_cost: Optional[float] = None) -> Choice:
    if requested != "auto":
        return require_int("num_workers", requested, 0, auto=True), CALLER
    costly = ""
    if path in ("batch", "iterable") and reads_in_process(dataset):
        hand_off = hand_off_seconds(dataset)
        if path == "batch" or read_cost is None or hand_off is None:
            return 0, "stored pixels, no decoding: cheaper in process than through shared memory"
        costs = f"reading a sample costs {read_cost * 1e6:,.0f} us in process (measured), handing it over " \
                f"from a worker {hand_off * 1e6:,.0f} us"
        if read_cost <= hand_off or cpus < 2:
            return 0, f"stored pixels: {costs}, so they are read in process"
        costly = f"{costs}, so workers read in parallel; "
    if cpus < 2:
        return 0, "1 usable CPU: workers would compete with training"
    wanted = default_workers(cpus)
    if batches is not None and batches < wanted:
        return batches, f"{costly}{cpus} usable CPUs but only {batches} batch{'es' * (batches != 1)} per epoch"
    if shards is not None and shards < wanted:
        return wanted, (f"{costly}{cpus} usable CPUs; this rank's {shards} shard{'s' * (shards != 1)} are read by "
                        f"every worker, each decoding 1 sample in {wanted} (reading a shard twice costs less than "
                        "decoding on one CPU)")
    if cpus == 2:
        return 2, f"{costly}2 usable CPUs: one core left idle would cost half the decode rate"
    return wanted, f"{costly}{cpus} usable CPUs, one kept for the training process"


def choose_decode_threads(requested: Auto, dataset: Any, path: str, workers: int, cpus: int) -> Choice:
    threaded = path == "batch" and getattr(dataset, "cpu_bound", True) and \
        "threads" in inspect.signature(dataset.get_batch).parameters
    if requested != "auto":
        threads = require_int("decode_threads", requested, 1, auto=True)
        if threads > 1 and not threaded:
            raise OptionError(f"decode_threads={threads}: applies to a pixfeed dataset that decodes whole batches "
                              "(encoded records opened with size=); this one has no per-image decoding to share")
        return threads, CALLER
    if not threaded:
        return 1, _no_decode_threads(dataset, path, workers)
    if workers:
        return 1, f"each of the {workers} workers decodes its own batches"
    if cpus < 2:
        return 1, "1 usable CPU"
    return cpus, (f"no workers: each batch's images decode on {cpus} threads in this process (the decoders and "
                  "the resize release the GIL; no shared-memory copies)")


def _no_decode_threads(dataset: Any, path: str, workers: int) -> str:
    """Why a read takes no decode threads: what decodes, and where, on this path."""
    where = "in the worker" if workers == 1 else f"in each of the {workers} workers" if workers else "in this process"
    if path == "iterable":
        return f"the dataset decodes each sample as it yields it, one at a time {where}"
    if path == "samples":
        return f"per-sample reads: each image decodes as its sample is read, {where}"
    if not getattr(dataset, "cpu_bound", True):
        return "stored pixels: a batch read copies them, no per-image decoding"
    return "the dataset's get_batch takes no threads argument"


def choose_training_threads(requested: Auto, workers: int, cpus: int) -> Choice:
    if requested is None:
        return None, "left as it is (training_threads=None)"
    if requested != "auto":
        return require_int("training_threads", requested, 1, auto=True), CALLER
    current = torch.get_num_threads()
    if not workers:
        return None, f"no workers: torch keeps its {plural(current, 'thread')}"
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None, "torch's own thread pool (not OpenMP): its idle threads wait without spinning"
    spare = max(1, cpus - workers)
    if current <= spare:
        return None, f"torch already uses {plural(current, 'thread')}, within the CPUs the workers leave"
    return spare, (f"{current} -> {spare} while batches are read: {workers} workers decode on the {cpus} usable "
                   "CPUs, where torch's idle threads would spin-wait (threads.py)")


def choose_stall_timeout(requested: Any) -> Choice:
    if isinstance(requested, bool) or not isinstance(requested, (int, float)) or not requested > 0:
        raise OptionError(f"stall_timeout must be a number of seconds > 0, not {requested!r}")
    reason = CALLER if requested != STALL_TIMEOUT else "default: a reader without progress this long raises"
    return float(requested), reason


def choose_read_ahead(requested: Auto, workers: int, cuda: bool) -> Choice:
    if requested != "auto":
        return check_bool("read_ahead", requested), CALLER
    if workers:
        return False, "off: the workers read ahead (prefetch_factor)"
    if cuda:
        return True, ("on: with CUDA the training thread launches the step's kernels, and a fast model's "
                      "launches take it for as long as an in-process read would (ResNet-18, H200: 0.91 of "
                      "its appetite with the reader thread, 0.69 without)")
    return False, ("off: no CUDA device, so the training step runs on these CPUs; a reader thread would take "
                   "them from it (read_ahead=True overlaps reads with a step that waits)")


def choose_pin_memory(requested: Auto) -> Choice:
    if requested != "auto":
        return check_bool("pin_memory", requested), CALLER
    cuda = torch.cuda.is_available()
    return cuda, "CUDA available" if cuda else "no CUDA"


def choose_persistent(requested: Auto, workers: int, dataset: Any) -> Choice:
    if requested != "auto":
        if check_bool("persistent_workers", requested) and workers == 0:
            raise OptionError("persistent_workers=True needs num_workers > 0; use persistent_workers='auto'")
        return requested, CALLER
    if workers and epoch_needs_fresh_workers(dataset):
        return False, "fresh workers each epoch so they see the dataset's set_epoch"
    return workers > 0, "keep workers between epochs" if workers else "no workers"


def choose_prefetch(requested: Auto, workers: int, batch_bytes: Optional[int]) -> Choice:
    if requested != "auto":
        if workers == 0:
            raise OptionError("prefetch_factor needs num_workers > 0; use prefetch_factor='auto'")
        return require_int("prefetch_factor", requested, 1, auto=True), CALLER
    if workers == 0:
        return None, "no workers"
    if batch_bytes is None:
        return 2, "batch size in bytes unknown: torch's default"
    ready = PREFETCH_BUDGET // (batch_bytes * workers)
    return max(1, min(MAX_PREFETCH, ready)), f"{PREFETCH_BUDGET >> 20} MiB budget, {batch_bytes >> 10} KiB batches"


def shards_per_rank(dataset: Any, world: World) -> Optional[int]:
    """The whole shards each rank of a sharded iterable dataset (WebDataset) reads; None for other datasets."""
    shards = getattr(dataset, "shards", None)
    if not isinstance(dataset, IterableDataset) or not isinstance(shards, list):
        return None
    return max(1, len(shards) // world.size)


def batches_per_rank(dataset: Any, batch_size: int, world: World, drop_last: bool) -> Optional[int]:
    if isinstance(dataset, IterableDataset):
        return None
    samples = len(dataset) // world.size if drop_last else math.ceil(len(dataset) / world.size)
    return samples // batch_size if drop_last else math.ceil(samples / batch_size)


GPU_DECODE_RATE = 10_000  # full-size ImageNet JPEGs/s one GPU's nvImageCodec decodes (H200: 10,827-11,248)
CPU_DECODE_RATE = 340  # the same per CPU core (H200 machine, 16 cores; issue #37)
# the device stage's host time an image in its one thread (read, plans, the stage's own work and its CUDA launches):
# benchmarks/gpu_host.py's read + est. on the 2-CPU development machine, loaded (issue #45): about 11 + 72 µs for
# full-size JPEGs, 42 + 16 for stored 256x256 pixels; a quiet server core takes less
HOST_US = {"encoded": 85.0, "stored": 60.0}


def device_rate(kind: str, host_us: Optional[float] = None) -> Tuple[int, str]:
    """(images/s, the words for the plan): the device path's rate, the lower of its decoder's (encoded records:
    ``GPU_DECODE_RATE``) and its host thread's (1e6 / ``host_us``: measured, or ``HOST_US``'s estimate)."""
    us = HOST_US[kind] if host_us is None else max(float(host_us), 1e-3)
    host = int(1e6 / us)
    how = f"{us:.0f} µs an image, " + ("measured" if host_us is not None else "estimated by benchmarks/gpu_host.py")
    if kind != "encoded":
        return host, f"about {host:,} images/s, the host thread's ({how}); the GPU's crops take far less"
    rate = min(GPU_DECODE_RATE, host)
    return rate, (f"about {rate:,} images/s, the lower of the decoder's (about {GPU_DECODE_RATE:,}/s) and the host "
                  f"thread's (about {host:,}/s: {how})")


def resolve_device(requested: Any, local_rank: Optional[int] = None) -> Optional[torch.device]:
    """make_loader's ``device=`` as a torch device (None: batches stay where they are read, as before).
    ``"cuda"`` without an index is ``cuda:LOCAL_RANK`` under torchrun; CUDA asked for without a usable
    CUDA device raises, as ``tensor.to("cuda")`` does."""
    if requested is None:
        return None
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError, ValueError):
        raise OptionError(f"device {requested!r}: expected None, 'cpu', 'cuda', 'cuda:N' or a torch.device") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise OptionError(f"device {requested!r}: pixfeed feeds 'cpu' or CUDA devices ('cuda', 'cuda:N')")
    if not torch.cuda.is_available():
        raise OptionError(f"device {str(requested)!r}: CUDA is not available (torch.cuda.is_available() is "
                          f"False: no CUDA GPU, driver or CUDA build of torch {torch.__version__}); "
                          "leave device= out to get CPU batches")
    count = torch.cuda.device_count()
    index = device.index if device.index is not None else local_rank if local_rank is not None else \
        torch.cuda.current_device()
    if index >= count:
        raise OptionError(f"device {str(requested)!r}: CUDA device {index} does not exist (this machine has "
                          f"{plural(count, 'CUDA device')})")
    return torch.device("cuda", index)


def choose_decode_on(device: torch.device, kind: str, cpus: int, decoder: Tuple[bool, str],
                     host_us: Optional[float] = None) -> Choice:
    """Where a ``device=`` loader's images are made: ``"device"`` (encoded records decoded by the GPU's
    decoder, stored pixels cropped there) or ``"cpu"`` (today's path, its batches copied).  ``kind``:
    "encoded" (records the GPU can decode), "stored" (stored pixels a random crop or resize reads), else
    what the dataset reads as it is; ``decoder``: ``gpu.available(device)``; ``host_us``: the device stage's
    measured host time an image (else ``HOST_US``'s estimate, see ``device_rate``)."""
    if device.type != "cuda":
        return "cpu", "CPU batches: the same reads and crops as without device="
    if kind == "stored":
        return "device", ("stored pixels gathered in process into pinned memory, copied, then every sample's "
                          f"crop and flip in batched kernels on the GPU: {device_rate(kind, host_us)[1]}")
    if kind != "encoded":
        return "cpu", f"{kind}: read as without device=, each batch copied to {device} on a side stream"
    ok, why = decoder
    if not ok:
        return "cpu", f"CPU workers decode ({why}); batches copied to {device} on a side stream"
    cpu_rate = max(1, default_workers(cpus)) * CPU_DECODE_RATE
    rate, words = device_rate(kind, host_us)
    if cpu_rate > rate:
        return "cpu", (f"{cpus} usable CPUs decode about {cpu_rate:,} images/s, more than {device}'s path ({words}): "
                       "CPU workers decode, batches are copied")
    return "device", (f"{why}: {words}, against about {cpu_rate:,}/s on {cpus} usable CPUs; records read as bytes, "
                      "decoded in this process on its own stream")
