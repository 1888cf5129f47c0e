"""``make_loader(dataset, batch_size, device=...)``: batches on a device, made there where it pays (issue #37).

``device=None`` (the default) is the loader as it always was.  Otherwise every
batch comes out on ``device``, its images ``dtype`` (uint8, or float32/bfloat16/float16
normalised by ``mean``/``std``, ImageNet's by default) in ``memory_format``
(channels_last by default), and where the images are made is the plan's
``decode_on`` (``plan.choose_decode_on``, the reason in ``loader.pixfeed_plan``):

* encoded records (a pixfeed map-style dataset opened with ``size=``, no
  ``transform``, no fields, ``exact=False``): read as bytes in this process (the
  loader's own sampler, seeding, splitting and resume: a ``DeviceRecords`` view is
  fed through ``build_loader``), each sample's plan drawn on the CPU from the
  header with the record's own generator (as ``ImageRecords.pixels`` and
  ``FieldValues.plan_for`` draw it), then decoded by ``pixfeed.image.gpu.BatchDecoder``
  on the device, when the GPU's decoder outruns the CPUs (about 10,000 full-size
  ImageNet JPEGs/s against about 340 a core); else CPU workers decode as before.
* stored pixels that a random crop or a resize reads: gathered in process,
  copied into a pinned buffer (a ring of them, reused), copied to the device
  ``non_blocking``, and every sample's box, resize and flip made by
  ``gpu.crop_resize_batch`` in batched kernels.
* a mixture (``pixfeed.mix``) whose sources all qualify with one kind and one geometry (encoded
  records of one ``size``, ``crop`` and ``crop_ratio``; or stored pixels of one stored shape, ``size``
  and ``crop``): each run of one source in a batch (``Mixture.runs``, the CPU path's order) read by
  that source, its crops drawn from (seed, source, pass, record) as the CPU path draws them
  (``Mixture._draws``), its labels mapped into the mixture's classes, records and plans joined into
  one batch (``with_source=True``: the source indices come third).  The next epoch's first batch is
  not made ahead for a mixture (which records an index names follows the mixture's epoch).
* anything else (a ``transform``, fields: masks, second images and boxes keep
  the CPU path with the image's plan, a user's dataset, ``exact=True``, a WebDataset,
  center-cropped stored pixels, which are a slice already, a mixture with such a source or whose
  sources differ in kind or geometry): read as without ``device=``, every tensor of the batch copied
  to the device, the reason in the plan's ``decode_on``.

The device stage runs in one reader thread for the loader's lifetime, epoch after
epoch (``DeviceFeed``: an epoch's batches; starting an epoch ends the one before, and
what was made ahead for that one is dropped): it reads the next
batch and makes it on its own CUDA stream while the training step runs, records an
event, and the training loop's stream waits on that event (no synchronisation of
the default stream); each output tensor is ``record_stream``-ed on the consuming
stream, so the caching allocator reuses the same blocks every batch and GPU
memory stays flat across epochs.  ``state_dict`` counts the batches the training
loop took, not the ones made ahead, so a resume repeats none and skips none.

``device="cpu"`` gives CPU batches with the default path's pixels (converted as
asked).  ``"cuda"`` without an index is ``cuda:LOCAL_RANK`` under torchrun; CUDA
asked for without a usable CUDA device raises OptionError.
"""
from __future__ import annotations

import copy
import os
from contextlib import nullcontext
import queue
import threading
import time
import weakref
from typing import Any, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from pixfeed.datasets.base import MapImageDataset
from pixfeed.errors import Location, OptionError
from pixfeed.image import geometry, gpu
from pixfeed.image.decode import oriented_size
from pixfeed.loaders import plan as rules
from pixfeed.loaders import batch as batch_module
from pixfeed.loaders.batch import ReadAhead
from pixfeed.loaders.loader import PixfeedLoader, build_loader
from pixfeed.loaders.tune import tuned_loader
from pixfeed.machine.cpus import available_cpus
from pixfeed.machine.world import World
from pixfeed.mixing.dataset import Mixture
from pixfeed.loaders.sampler import ResumableSampler
from pixfeed.loaders.seeding import INDEX, SeededSamples
from pixfeed.seeds import crop_draws, seeded_by_index

ENCODED, STORED = "encoded", "stored"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DTYPES = (torch.uint8, torch.float32, torch.bfloat16, torch.float16)
FORMATS = (torch.channels_last, torch.contiguous_format)
DEPTH = 2  # batches made ahead of the training loop


class Encoded(NamedTuple):
    """A batch as ``DeviceRecords`` reads it for the device's decoder."""
    records: list  # bytes, memoryviews or uint8 arrays: as read, not copied
    plans: geometry.Plans
    labels: torch.Tensor
    heads: list  # each record's gpu.gpu_head (None: the CPU decodes it), parsed once
    sources: Optional[torch.Tensor] = None  # a mixture's with_source=True: each sample's source index


class _Early(NamedTuple):
    """A batch read and made ahead of its epoch (``DeviceStage.start_next``): the stage's ``make`` of it."""
    made: Tuple[Any, Any]


class Stored(NamedTuple):
    """Stored pixels (N x h x w x 3 uint8) and each sample's plan; read into a reserved pinned slot
    (``gpu.Staging.reserve``) with the labels and ``params`` (``gpu.plan_array``) beside them where it can."""
    pixels: np.ndarray
    plans: geometry.Plans
    labels: torch.Tensor
    params: Optional[np.ndarray] = None
    sources: Optional[torch.Tensor] = None  # a mixture's with_source=True: each sample's source index


def feed_kind(dataset: Any) -> Tuple[str, str]:
    """(ENCODED, STORED or a description of another kind, reason): what the device can make of ``dataset``."""
    if isinstance(dataset, Mixture):
        return _mixture_kind(dataset)
    if isinstance(dataset, IterableDataset) or not isinstance(dataset, MapImageDataset):
        return "a dataset of its own", "not a pixfeed map-style dataset"
    if dataset.transform is not None:
        return "a transform", "its transform runs per sample on the CPU"
    if not dataset.default_fields:
        return "fields", "fields that follow the image keep the CPU path with its plan"
    if dataset.store == "encoded":
        if dataset.size is None:
            return "whole images", "no size=: images of different sizes"
        if dataset.exact:
            return "exact=True", "exact=True asks for Pillow's pixels"
        return ENCODED, "encoded records"
    if dataset.cpu_bound:
        return STORED, "stored pixels, cropped or resized"
    return "stored pixels, sliced", "a center crop of stored pixels is a slice"


GEOMETRY = {ENCODED: ("size", "crop", "crop_ratio"), STORED: ("stored_shape", "size", "crop")}


def _mixture_kind(mix: Mixture) -> Tuple[str, str]:
    """``feed_kind`` of a mixture: its sources' kind when they all have it and one geometry (``GEOMETRY``:
    a batch of several sources is then made in one step), else what keeps it on the CPU, naming the source."""
    kinds = [feed_kind(s) for s in mix.sources]
    for name, (kind, why) in zip(mix.names, kinds):
        if kind not in (ENCODED, STORED):
            return f"a mixture with {kind} ({name})", f"{name}: {why}"
    if len({kind for kind, _ in kinds}) > 1:
        return "a mixture of encoded records and stored pixels", "its sources differ in kind: " + ", ".join(
            f"{name} {'encoded records' if kind == ENCODED else 'stored pixels'}"
            for name, (kind, _) in zip(mix.names, kinds))
    kind, why = kinds[0]
    first = mix.sources[0]
    for name, ds in zip(mix.names[1:], mix.sources[1:]):
        for key in GEOMETRY[kind]:
            if getattr(ds, key) != getattr(first, key):
                return f"a mixture whose sources differ in {key}", (
                    f"{name}'s {key} {getattr(ds, key)!r} differs from {mix.names[0]}'s {getattr(first, key)!r}; "
                    "the device makes a batch in one geometry")
    return kind, f"{why} in every source of the mixture"


def feed_size(dataset: Any) -> Any:
    """The output size the device makes (a mixture's: its sources' one size)."""
    return dataset.sources[0].size if isinstance(dataset, Mixture) else getattr(dataset, "size", None)


class DeviceRecords(Dataset):
    """A pixfeed dataset read for the device: ``get_batch`` returns the stored records and each sample's
    plan (``Encoded`` or ``Stored``), not pixels.  Everything else is the dataset's own."""

    cpu_bound = False  # reading is a copy: in process (plan.choose_workers)

    def __init__(self, dataset: MapImageDataset, kind: str, staging: Optional[gpu.Staging] = None) -> None:
        self.dataset, self.kind = dataset, kind
        self.staging = staging  # stored pixels read straight into its pinned slots (in this process only)
        self.reader: Optional[threading.Thread] = None  # the one thread that may (the stage's), None: any
        self.early: Optional[Tuple[tuple, Any, _Early]] = None  # (indices, crop draws, the next epoch's first batch)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "kind", "staging", "early", "reader"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "staging": None, "early": None, "reader": None}  # a worker's copy: its own arrays

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.get_batch([index])

    @property
    def fixed_shape(self) -> Optional[Tuple[int, int, int]]:
        return self.dataset.fixed_shape

    def get_batch(self, indices: Sequence[int]) -> Any:
        """The batch's records and plans: every crop drawn in one vectorised step from (seed, epoch, index)
        (``seeds.crop_draws``, as the CPU path draws them), each JPEG header parsed once."""
        ds = self.dataset
        early, self.early = self.early, None
        if isinstance(ds, Mixture):
            return self._mixed(ds, indices)
        if early is not None and early[0] == tuple(int(i) for i in indices) and \
                np.array_equal(early[1], crop_draws(indices) if ds.crop == "random" else None):
            return early[2]  # made ahead: the same records with the same draws
        slot = self._slot(len(indices)) if self.kind == STORED else None
        if slot is not None:  # copied once on the host: from the pack into the pinned slot
            return self._stored_into(indices, *slot)
        idx, stored, labels = ds.read_checked(indices)
        return _made(ds, self.kind, idx, stored, labels, crop_draws(idx) if ds.crop == "random" else None)

    def _mixed(self, mix: Mixture, indices: Sequence[int]) -> Any:
        """A mixture's batch (the module's docstring): each run read by its source into its rows (into the
        staging's slot where every source reads into a given array), its crops drawn as ``Mixture.get_batch``
        draws them (from (seed, source, pass, record)), its labels mapped; records and plans joined."""
        source, records, passes, runs = mix.runs(indices)
        slot = self._slot(len(source)) if self.kind == STORED else None
        parts = []
        for s, lo, hi in runs:
            ds = mix.sources[s]
            with mix._draws(s, int(passes[lo])):
                draws = crop_draws(records[lo:hi]) if ds.crop == "random" else None
            if slot is not None:
                idx, stored, labels = ds.read_checked(records[lo:hi], out=slot[0][lo:hi])
            else:
                idx, stored, labels = ds.read_checked(records[lo:hi])
            table = mix._tables[s]
            parts.append(_made(ds, self.kind, idx, stored, labels if table is None else table[np.asarray(labels)],
                               draws))
        sources = torch.from_numpy(source) if mix.with_source else None
        plans = _joined_plans([p.plans for p in parts])
        labels = torch.cat([p.labels for p in parts]) if parts else torch.empty(0, dtype=torch.int64)
        if self.kind == ENCODED:
            return Encoded([r for p in parts for r in p.records], plans, labels, [h for p in parts for h in p.heads],
                           sources)
        if slot is None:
            return Stored(np.concatenate([p.pixels for p in parts]), plans, labels, sources=sources)
        slot[1][:], slot[2][:] = labels.numpy(), gpu.plan_array(plans)
        if sources is not None:
            slot[3][:] = source
            sources = torch.from_numpy(slot[3])
        return Stored(slot[0], plans, torch.from_numpy(slot[1]), slot[2], sources)

    def _slot(self, count: int) -> Optional[List[np.ndarray]]:
        """(pixels, labels, params) arrays in the staging's next pinned slot, or None: no staging (off CUDA,
        a worker process), a dataset that cannot gather its stored pixels into a given array, or a thread other
        than the stage's (the watchdog's reader thread: an epoch left early may leave its read running, and a
        slot must not be written by two)."""
        ds = self.dataset
        sources = ds.sources if isinstance(ds, Mixture) else [ds]
        if self.staging is None or not all(s.reads_into for s in sources) or get_worker_info() is not None or \
                (self.reader is not None and threading.current_thread() is not self.reader):
            return None
        with_source = [((count,), np.int64)] if isinstance(ds, Mixture) and ds.with_source else []
        return self.staging.reserve([((count, *sources[0].stored_shape), np.uint8), ((count,), np.int64),
                                     ((count, 9), np.int64), *with_source])

    def _stored_into(self, indices: Sequence[int], pixels: np.ndarray, labels: np.ndarray,
                     params: np.ndarray) -> Stored:
        ds = self.dataset
        idx, _, read = ds.read_checked(indices, out=pixels)
        labels[:] = read
        plans = _stored_plans(ds, pixels, crop_draws(idx) if ds.crop == "random" else None)
        params[:] = gpu.plan_array(plans)
        return Stored(pixels, plans, torch.from_numpy(labels), params)


def _made(ds: MapImageDataset, kind: str, idx: np.ndarray, stored: Any, labels: Any,
          draws: Optional[np.ndarray]) -> Any:
    """``Encoded`` or ``Stored`` of records ``idx`` of ``ds`` as read (``read_checked``), their crops from ``draws``."""
    labels = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    if kind == ENCODED:
        records = [memoryview(s) if isinstance(s, np.ndarray) else s for s in stored]  # views: not copied
        heads = [gpu.gpu_head(r) for r in records]
        sizes = [head.oriented if head is not None else oriented_size(r, Location(ds.where, int(i)))
                 for r, head, i in zip(records, heads, idx)]
        w, h = np.array(sizes, np.int64).reshape(-1, 2).T
        return Encoded(records, geometry.plans(w, h, ds.size, ds.crop, draws, ds.crop_ratio), labels, heads)
    pixels = stored if isinstance(stored, np.ndarray) else np.stack([np.asarray(s) for s in stored])
    return Stored(pixels, _stored_plans(ds, pixels, draws), labels)


def _joined_plans(parts: List[geometry.Plans]) -> geometry.Plans:
    """One batch's plans from its runs' (one geometry, so all drawn or none)."""
    if len(parts) == 1:
        return parts[0]
    return geometry.Plans(*(np.concatenate([getattr(p, name) for p in parts])
                            for name in ("box", "src", "scaled", "offset", "flip")), parts[0].random)


def _stored_plans(ds: MapImageDataset, pixels: np.ndarray, draws: Optional[np.ndarray]) -> geometry.Plans:
    """A plan for each of the stored ``pixels``, drawn or not (a center crop resized), as ImageRecords.pixels."""
    h, w = (np.full(len(pixels), side, np.int64) for side in pixels.shape[1:3])
    return geometry.plans(w, h, ds.size, ds.crop, draws)


class DeviceStage:
    """Makes each batch on ``device``: decodes (``ENCODED``), crops (``STORED``) or copies it, then converts
    its images to ``dtype`` and ``memory_format``; ``__call__`` wraps an epoch's batches in a ``DeviceFeed``."""

    def __init__(self, device: torch.device, kind: Optional[str], size, dtype: torch.dtype,
                 mean: Optional[Sequence[float]], std: Optional[Sequence[float]], memory_format: torch.memory_format,
                 backend: str = "auto", cpu_threads: int = 1, threaded: bool = True, read_ahead: bool = False) -> None:
        self.threaded, self.read_ahead = threaded, read_ahead  # threaded False: converted as the loop takes them
        self.device, self.kind, self.size, self.dtype, self.memory_format = device, kind, size, dtype, memory_format
        self.backend, self.cpu_threads = backend, cpu_threads
        self.mean, self.std = mean, std
        self._norm: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        self._decoder: Optional[gpu.BatchDecoder] = None
        self._stream: Any = None
        self.staging = gpu.Staging(device, slots=DEPTH + 2)  # pinned on CUDA: pixels, plans, labels in one copy
        self._lock = threading.Lock()  # one make at a time (a caller's own threads may call make)
        self._jobs: "queue.Queue[Any]" = queue.Queue()  # epochs for the one reader thread
        self._thread: Optional[threading.Thread] = None
        self._feed: Any = None  # a weak proxy of the epoch's feed
        self.host_seconds, self.images_made = 0.0, 0  # the reader thread's CPU time on encoded/stored batches
        self.explain: Any = None  # host µs an image -> the plan's decode_on reason, refreshed at each epoch's end
        self.plan: Any = None
        self.loader: Any = None  # a weakref to the loader, and its DeviceRecords view: the next epoch's first batch
        self.view: Optional[DeviceRecords] = None
        self._read_all = False

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        if not self.threaded:
            return (self._make(b) for b in (ReadAhead(batches) if self.read_ahead else batches))
        if self._feed is not None:  # an epoch left early: it ends here, its batches made ahead are dropped
            try:
                self._feed.close()
            except ReferenceError:  # collected (and so closed) already
                pass
        feed = DeviceFeed(self, batches)
        self._feed = weakref.proxy(feed)  # not kept alive here: dropped by the loop, it closes
        following = self.following()
        self._jobs.put((feed.ahead, self._timed(batches), lambda: self.after_epoch(following)))  # not the feed
        if self._thread is None or not self._thread.is_alive():  # one for the loader's lifetime
            self._thread = threading.Thread(target=_read, args=(self._jobs,), name="pixfeed-device", daemon=True)
            _READERS[self._thread] = self._jobs
            if self.view is not None:
                self.view.reader = self._thread  # reads into the pinned slots in this thread only
            self._thread.start()
        return feed

    def _timed(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The epoch's batches made, the reader thread's CPU time on each (its read and its make) counted."""
        source = iter(batches)
        while True:
            start = time.thread_time()
            try:
                batch = next(source)
            except StopIteration:
                break
            made = self.make(batch)
            if isinstance(batch, (Encoded, Stored)):
                self.host_seconds += time.thread_time() - start
                self.images_made += len(batch.labels)
            yield made
        self._read_all = True  # the next epoch's first batch may be made ahead (after_epoch)
        if self.plan is not None and self.explain is not None and self.host_us is not None:
            self.plan.reasons["decode_on"] = self.explain(self.host_us)

    def after_epoch(self, following: Optional[tuple]) -> None:
        """In the reader thread, once an epoch's end is handed to the loop: the following epoch started ahead."""
        if self._read_all:
            self._read_all = False
            try:
                self.start_next(following)
            except Exception:  # noqa: BLE001 - a guess: the next epoch reads its first batch itself
                self.view.early = None

    def following(self) -> Optional[tuple]:
        """When an epoch starts (in the loop's thread): what the one after it would read first, if it can be known
        (pixfeed's sampler, reads in process, records seeded by index or not drawn at all): (a copy of the
        sampler for that epoch, its number, the seed or None), else None."""
        loader = self.loader() if self.loader is not None else None
        if loader is None or self.view is None or loader.num_workers or loader.pixfeed_plan.on_error != "raise" or \
                loader.pixfeed_plan.reader_thread or not isinstance(loader.sampler, ResumableSampler):
            return None  # reader_thread: a read may wait on storage, and only the watchdog's thread bounds the wait
        if isinstance(self.view.dataset, Mixture):
            return None  # the records an index names follow the mixture's epoch, set when that epoch starts
        source = loader.dataset
        seeded = isinstance(source, SeededSamples) and source.mode == INDEX
        if not seeded and self.view.dataset.crop == "random":
            return None  # draws from the process's RNG: not known ahead
        sampler = copy.copy(loader.sampler)
        sampler.epoch, sampler.offset, sampler.hints = loader.epoch, 0, None  # loader.epoch: the next one's
        return sampler, loader.epoch, source.seed if seeded else None, loader.batch_size, loader.drop_last

    def start_next(self, following: Optional[tuple]) -> None:
        """At an epoch's end in the reader thread (the loop still takes its last batches): read and make the
        next epoch's first batch now.  The view hands it out only if the next epoch's first read asks for
        exactly those records with exactly those draws: a set_epoch, a resume or another world in between
        make it a wasted read, never a wrong batch."""
        if following is None:
            return
        sampler, epoch, seed, batch_size, drop_last = following
        indices = [int(i) for i in sampler.indices()[:batch_size]]
        if not indices or (drop_last and len(indices) < batch_size):
            return
        view = self.view
        with seeded_by_index(seed, epoch) if seed is not None else nullcontext():
            draws = crop_draws(indices) if view.dataset.crop == "random" else None
            batch = view.get_batch(indices)
        view.early = (tuple(indices), draws, _Early(self.make(batch)))

    @property
    def host_us(self) -> Optional[float]:
        """The reader thread's CPU µs an image so far (reading, plans, the stage's work), None before any."""
        return self.host_seconds / self.images_made * 1e6 if self.images_made else None

    def __del__(self) -> None:
        jobs = self.__dict__.get("_jobs")
        if jobs is not None:
            jobs.put(None)  # the reader thread ends

    @property
    def stream(self) -> Any:
        if self._stream is None and self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
        return self._stream

    def make(self, batch: Any) -> Tuple[Any, Any]:
        """(the batch on the device, the event the consumer waits on or None)."""
        if isinstance(batch, _Early):
            return batch.made
        with self._lock:
            if self.device.type != "cuda":
                return self._make(batch), None
            with torch.cuda.device(self.device):
                stream = self.stream  # the event goes on the stream the work went on
                with torch.cuda.stream(stream):
                    out = self._make(batch)
                    event = torch.cuda.Event()
                    event.record(stream)
            return out, event

    def _make(self, batch: Any) -> Any:
        if isinstance(batch, Encoded):
            if self._decoder is None:  # one for the loader's lifetime
                self._decoder = gpu.BatchDecoder(self.device, self.backend, cpu_threads=self.cpu_threads)
            images = self._decoder.decode(batch.records, batch.plans, self.size, batch.heads)
            columns = self.staging.send([batch.labels.numpy(), *_source_column(batch)])
            return (self.images(images), *columns)
        if isinstance(batch, Stored):
            params = gpu.plan_array(batch.plans) if batch.params is None else batch.params
            pixels, labels, params, *sources = self.staging.send([batch.pixels, batch.labels.numpy(), params,
                                                                  *_source_column(batch)])  # the slot's layout
            images = gpu.crop_resize_batch(pixels.permute(0, 3, 1, 2), batch.plans, self.size, params)
            return (self.images(images), labels, *sources)
        moved = _moved(batch, self.device)
        if isinstance(moved, dict) and "image" in moved:
            moved["image"] = self.images(moved["image"])
        elif isinstance(moved, (tuple, list)) and moved and isinstance(moved[0], torch.Tensor):
            moved = type(moved)([self.images(moved[0]), *moved[1:]])
        elif isinstance(moved, torch.Tensor):
            moved = self.images(moved)
        return moved

    def images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (N x 3 x H x W) as ``dtype`` (normalised when not uint8) in ``memory_format``."""
        if images.dtype != torch.uint8 or images.dim() != 4:
            return images
        if self.dtype != torch.uint8:
            if self._norm is None:
                self._norm = tuple(torch.tensor(v, dtype=torch.float32, device=self.device).view(1, -1, 1, 1)
                                   for v in (self.mean, self.std))
            mean, std = self._norm
            images = images.float().div_(255).sub_(mean).div_(std).to(self.dtype)
        return images.contiguous(memory_format=self.memory_format)


def _source_column(batch: Any) -> list:
    """A mixture's source indices (``with_source=True``) as an array to send, else nothing."""
    return [] if batch.sources is None else [batch.sources.numpy()]


def _moved(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: _moved(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_moved(v, device) for v in batch) if not hasattr(batch, "_fields") else \
            type(batch)(*(_moved(v, device) for v in batch))
    return batch


def _streamed(batch: Any, stream: Any) -> None:
    """``record_stream`` every tensor of ``batch`` on the consumer's stream: its memory is not handed
    out again (to the side stream) until the work queued on that stream so far is done."""
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif isinstance(batch, dict):
        for v in batch.values():
            _streamed(v, stream)
    elif isinstance(batch, (tuple, list)):
        for v in batch:
            _streamed(v, stream)


def _read(jobs: "queue.Queue[Any]") -> None:
    """The stage's reader thread: each epoch's batches made in turn, until the stage is gone (None).  It holds
    the queue and the epoch's pipe, not the stage nor the feed: the loop dropping a feed closes it."""
    while True:
        job = jobs.get()
        if job is None:
            return
        ahead, made, after = job
        if not ahead._stop.is_set():
            ahead._fill(made)
            after()
        del job, ahead, made, after


_READERS: "weakref.WeakKeyDictionary[threading.Thread, queue.Queue]" = weakref.WeakKeyDictionary()
_AHEADS: "weakref.WeakSet[_Ahead]" = weakref.WeakSet()


def _stop_readers() -> List[threading.Thread]:
    """At exit (``batch.stop_threads``): every epoch's making stops and each reader thread ends after it."""
    for ahead in list(_AHEADS):
        ahead._stop.set()
    readers = list(_READERS.items())
    for _, jobs in readers:
        jobs.put(None)
    return [thread for thread, _ in readers]


batch_module.AT_EXIT.append(_stop_readers)


class _Ahead(ReadAhead):
    """``ReadAhead``'s queue and stop flag, filled by the stage's reader thread rather than a thread of its own."""

    def __init__(self, depth: int) -> None:
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=depth)
        self._stop, self._finished = threading.Event(), False
        _AHEADS.add(self)


class DeviceFeed(Iterator[Any]):
    """An epoch's batches made on the device by the stage's reader thread, ``DEPTH`` ahead of the training
    loop.  Closed (at its end, by the collector, or by the next epoch's start) it makes no more and ends:
    nothing made for it reaches another epoch."""

    def __init__(self, stage: DeviceStage, batches: Iterator[Any]) -> None:
        self.stage, self.length = stage, batches
        self.ahead = _Ahead(DEPTH)  # filled by the stage's reader thread

    def __len__(self) -> int:
        return len(self.length)  # type: ignore[arg-type]

    def __next__(self) -> Any:
        if self.ahead._stop.is_set():
            self.ahead._finished = True  # closed: no batch of it is handed out after that
        batch, event = next(self.ahead)
        if event is not None:
            stream = torch.cuda.current_stream(self.stage.device)
            stream.wait_event(event)
            _streamed(batch, stream)
        return batch

    def close(self) -> None:
        self.ahead.close()

    def __del__(self) -> None:
        self.close()


def local_rank(world: World) -> Optional[int]:
    """This process's CUDA device index under torchrun (``LOCAL_RANK``), None when not launched so.  Read
    whatever ``world`` says: a loader made before ``init_process_group`` sees one process, yet its rank
    trains on cuda:LOCAL_RANK.  None too when that index is past the visible devices (a launcher that shows
    each process only its own GPU): the current device is then the one."""
    value = os.environ.get("LOCAL_RANK")
    if value is None or not value.isdigit():
        return None
    index = int(value)
    return index if index < torch.cuda.device_count() else None


def check_output(device: Any, dtype: Any, mean: Any, std: Any, memory_format: Any):
    """(dtype, mean, std, memory_format) checked; mean and std default to ImageNet's for float outputs."""
    if device is None:
        given = [name for name, value, default in (("dtype", dtype, torch.uint8), ("mean", mean, None),
                                                   ("std", std, None))
                 if value is not default and value != default]
        if given:
            raise OptionError(f"{', '.join(given)} shape batches on a device: pass device= ('cuda', 'cpu') with them")
        return dtype, mean, std, rules.check_memory_format(memory_format)  # CPU batches too (collate.py)
    if dtype not in DTYPES:
        raise OptionError(f"dtype {dtype!r}: expected one of {', '.join(map(str, DTYPES))}")
    if memory_format not in FORMATS:
        raise OptionError(f"memory_format {memory_format!r}: expected torch.channels_last or torch.contiguous_format")
    if dtype == torch.uint8:
        if mean is not None or std is not None:
            raise OptionError("mean and std normalise float outputs: pass dtype=torch.float32 (or bfloat16, "
                              "float16) with them")
        return dtype, None, None, memory_format
    mean = IMAGENET_MEAN if mean is None else tuple(float(v) for v in mean)
    std = IMAGENET_STD if std is None else tuple(float(v) for v in std)
    if len(mean) != 3 or len(std) != 3 or 0 in std:
        raise OptionError(f"mean {mean} and std {std}: three values each (RGB, on the 0..1 scale), std not 0")
    return dtype, mean, std, memory_format


def device_loader(dataset: Any, batch_size: int, *, device: Any, dtype: torch.dtype = torch.uint8,
                  mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                  memory_format: torch.memory_format = torch.channels_last, backend: str = "auto",
                  decode_on: str = "auto", num_workers: Any = "auto", **options: Any) -> PixfeedLoader:
    """``make_loader`` with ``device=`` (see the module's docstring).  ``decode_on="device"`` forces the
    device path (with ``backend="cpu"`` on a CPU device: nvImageCodec's CPU backend, the tests' stand-in)."""
    dtype, mean, std, memory_format = check_output(device, dtype, mean, std, memory_format)
    world = World.detect(options.get("distributed", "auto"))
    dev = rules.resolve_device(device, local_rank(world))
    kind, why = feed_kind(dataset)
    if decode_on == "auto":
        decoder = gpu.available(dev) if kind == ENCODED and dev.type == "cuda" else (False, why)
        where, reason = rules.choose_decode_on(dev, kind, available_cpus(), decoder)
        if kind not in (ENCODED, STORED):
            reason = f"{reason}; not made on the device: {why}"
    elif decode_on in ("device", "cpu"):
        where, reason = decode_on, rules.CALLER
        if where == "device" and kind not in (ENCODED, STORED):
            raise OptionError(f"decode_on='device': {why}; only encoded records (size=, no transform or fields) "
                              "and stored pixels with a random crop or resize are made on the device (in a "
                              "mixture: every source, in one kind and geometry)")
    else:
        raise OptionError(f"decode_on {decode_on!r}: expected 'auto', 'device' or 'cpu'")
    if where == "device":
        options = {**options, "pin_memory": False if options.get("pin_memory", "auto") == "auto"
                   else options["pin_memory"]}  # stored pixels go through the stage's own pinned buffers
        view = DeviceRecords(dataset, kind)
        loader = build_loader(view, batch_size,
                              num_workers="auto" if num_workers == "tune" else num_workers, **options)
    elif num_workers == "tune":
        loader = tuned_loader(dataset, batch_size, **options)
    else:
        loader = build_loader(dataset, batch_size, num_workers=num_workers, **options)
    plan = loader.pixfeed_plan
    threaded = where == "device" or dev.type == "cuda"  # CPU batches converted on the CPU: as without device=
    stage = loader.pixfeed_device = DeviceStage(dev, kind if where == "device" else None,
                                                feed_size(dataset), dtype, mean, std, memory_format,
                                                backend, cpu_threads=min(gpu.CPU_THREADS, available_cpus()),
                                                threaded=threaded, read_ahead=plan.read_ahead)
    if where == "device" and kind == ENCODED:  # one decoder for the loader's lifetime, made here, not in its thread
        stage._decoder = gpu.BatchDecoder(dev, backend, cpu_threads=stage.cpu_threads).prepare()
    if where == "device" and kind == STORED:
        view.staging = stage.staging  # read into its pinned slots, sent from there
    if where == "device":  # the plan's rate for the device path, measured once an epoch has been made
        stage.plan, stage.explain = plan, lambda us: f"{reason}; as measured: {rules.device_rate(kind, us)[1]}"
        stage.loader, stage.view = weakref.ref(loader), view  # made ahead: the next epoch's first batch
    plan.device, plan.reasons["device"] = str(dev), f"batches as {dtype}, {_format_name(memory_format)}" + (
        f", normalised by mean {list(mean)} std {list(std)}" if mean is not None else "")
    if where == "device" and kind == ENCODED:  # the view reads bytes: the rules' words for stored pixels do not fit
        if num_workers in ("auto", "tune") and not plan.num_workers:
            plan.reasons["num_workers"] = "records read as bytes in this process (a copy); the device decodes them"
        plan.reasons["decode_threads"] = f"no decoding on the CPU but fallbacks (PNGs, CMYK): {gpu.CPU_THREADS} threads"
    plan.decode_on = (f"{dev} ({backend} backend)" if backend != "auto" else str(dev)) if where == "device" else "cpu"
    plan.reasons["decode_on"] = reason
    if threaded:
        plan.read_ahead, plan.reasons["read_ahead"] = True, (f"the device stage makes the next {DEPTH} batches "
                                                             f"on {dev} in its own thread")
    return loader


def _format_name(memory_format: torch.memory_format) -> str:
    return "channels_last" if memory_format == torch.channels_last else "contiguous"
