"""``build_loader``: a real ``torch.utils.data.DataLoader`` with every "auto" option resolved
(``make_loader``, in ``make.py``, is the entry point).

The rules live in ``plan.py`` (and ``shm.py`` for shared memory); the result
is attached as ``loader.pixfeed_plan`` and prints as a table of choices and reasons.

Order and epochs: map-style datasets go through torch's
``DistributedSampler`` order (``sampler.ResumableSampler``, a
``split.EpochSampler`` that can start part-way through an epoch, with one
replica when not distributed), so the order of epoch ``e`` is a function of
``(seed, e)`` alone, unless the caller gives its own ``sampler=``
(``plan.check_sampler``; a resume skips its first indices: ``_ResumedBatches``);
random augmentations are seeded per sample or per batch (``seeding.py``).
``on_error="skip"`` wraps what the DataLoader reads in ``damaged.SkipDamaged``.
Read-ahead hints and the in-process reader thread are turned on or off when
each epoch starts (``epochplan.py``).
``PixfeedLoader`` resolves the world and calls ``set_epoch`` on the sampler, and
on the dataset when it has one, each time iteration starts, counting epochs
itself; call ``loader.set_epoch(e)`` to resume at epoch ``e`` (a framework's
``set_epoch`` on the sampler does the same).  How frameworks that rebuild or
wrap the loader get exactly one split by rank: ``split.py``.

Distributed padding: with ``drop_last=False`` the sampler repeats the first
``(-len(dataset)) % world_size`` samples of the epoch's order so that every
rank gets ``ceil(len / world_size)`` samples and the same number of batches;
those few samples are seen twice.  With ``drop_last=True`` up to
``world_size - 1`` samples are left out instead and the last partial batch is
dropped, so no sample is seen twice.  Iterable datasets split themselves by
rank; the loader gives them ``rank`` and ``world_size`` when each epoch starts
when they have those attributes.
"""
from __future__ import annotations

import weakref
from itertools import islice
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from pixfeed.console.warn import warn_caller
from pixfeed.machine.cpus import available_cpus
from pixfeed.storage.pagecache import Extents
from pixfeed.errors import OptionError, require_int
from pixfeed.loaders import cacheplan, epochplan, fetchplan, plan as rules
from pixfeed.loaders.batch import BatchReader, ReadAhead
from pixfeed.loaders.collate import Collate
from pixfeed.loaders.damaged import SkipDamaged
from pixfeed.datasets.skips import SkipLog
from pixfeed.loaders.plan import Auto, LoaderPlan
from pixfeed.loaders.probe import read_seconds, sample_bytes
from pixfeed.loaders.readahead import Hinter
from pixfeed.loaders import resume
from pixfeed.loaders.progress import POLL, RecordedSampler, SplitSampler
from pixfeed.loaders.seeding import WorkerSeeder, iterable_seeding, seeded
from pixfeed.loaders.shm import choose_strategy, fit_shared_memory
from pixfeed.loaders.split import EpochSampler, split_iterable, split_warning
from pixfeed.loaders.threads import capped
from pixfeed.loaders.watchdog import watched
from pixfeed.machine.world import Distributed, World


class PixfeedLoader(DataLoader):
    """A DataLoader that resolves the world and calls ``set_epoch`` when each epoch starts, may read
    ahead in a thread, and saves and restores its place in an epoch (``state_dict``, ``load_state_dict``:
    ``resume.py``).  Its arguments are attributes of the same names, so frameworks that re-create
    a DataLoader from its attributes (Lightning) re-create it whole."""

    def __init__(self, *args: Any, pixfeed_plan: LoaderPlan, distributed: Distributed = "auto",
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pixfeed_plan = pixfeed_plan
        self.distributed = distributed
        self.pixfeed_progress = resume.Progress()
        self.pixfeed_resume_point: Optional[resume.Point] = None
        self.pixfeed_device: Any = None  # make_loader(device=...): the stage that puts batches on it (device.py)
        self.pixfeed_skip = 0  # a caller's sampler: its indices a resumed epoch skips (resume.py)
        self._resumed_batches = _ResumedBatches(weakref.ref(self))  # no cycle: GC would stop the workers late
        self.epoch = 0
        self._warned = False

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (to resume training)."""
        self.epoch = require_int("epoch", epoch, 0)

    def state_dict(self) -> Dict[str, Any]:
        """Where this rank is: a small JSON-serialisable dict for the training checkpoint."""
        return resume.state_of(self)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (a ``state_dict()``, possibly saved with another world size)."""
        self._use_world()
        resume.load(self, state)

    def __len__(self) -> int:
        self._use_world()
        return super().__len__()

    @property
    def _index_sampler(self) -> Any:
        """DataLoader's batches of indices; a caller's sampler's after a resume's skip (``pixfeed_skip``)."""
        if isinstance(self.sampler, EpochSampler) or not self._auto_collation or \
                getattr(getattr(self, "pixfeed_plan", None), "sampler", None) is None:
            return super()._index_sampler
        return self._resumed_batches

    def __iter__(self) -> Iterator[Any]:
        sampler = self.sampler if isinstance(self.sampler, EpochSampler) else None
        if sampler is not None and sampler.requested is not None:
            self.epoch = sampler.requested  # a framework (Lightning's fit loop) set the sampler's epoch
        for target in {id(t): t for t in (self.sampler, self.dataset, resume.user_dataset(self))}.values():
            if target is not sampler and callable(getattr(target, "set_epoch", None)):  # a framework's sampler
                target.set_epoch(self.epoch)
        self._use_world()
        if sampler is not None:
            sampler.start(self.epoch)
        point = resume.begin_epoch(self, self.epoch)
        epochplan.decide(self)
        self.epoch += 1
        batches = watched(self, super().__iter__)
        if self.pixfeed_device is not None:  # reads, decodes and copies the next batches in its own thread
            batches = self.pixfeed_device(batches)
        elif self.pixfeed_plan.read_ahead:
            batches = ReadAhead(batches)
        batches = capped(batches, self.pixfeed_plan.training_threads)
        return self.pixfeed_progress.track(batches, self.epoch - 1, point)

    def _use_world(self) -> World:
        """This epoch's world, handed to the sampler or iterable dataset; fresh workers if it changed."""
        world = World.detect(self.distributed)
        if world != self.pixfeed_plan.world:
            self.pixfeed_plan.world = world
            self._iterator = None  # persistent workers hold the old rank: start new ones
            if isinstance(self.worker_init_fn, WorkerSeeder):
                self.worker_init_fn.rank = world.rank
        yours = self.pixfeed_plan.sampler is not None and not isinstance(self.sampler, EpochSampler)
        if yours:  # a process group may have started since make_loader: the caller's sampler must split by it
            rules.check_sampler(self.sampler, None, self.dataset, world, self.distributed, None, "auto", "auto",
                                torch.channels_last)
        warning = "" if yours else split_warning(self.sampler, self.distributed, world)
        if warning and not self._warned:
            self._warned = True
            warn_caller(f"pixfeed: {warning}")
        if isinstance(self.sampler, EpochSampler):
            self.sampler.use(world)
        elif isinstance(self.dataset, IterableDataset):
            split_iterable(self.dataset, world)
        return world


class _ResumedBatches:
    """Batches of a caller's sampler, its first ``loader.pixfeed_skip`` indices left out (read at each
    iteration, so persistent workers' iterators see a resume too)."""

    def __init__(self, loader: "weakref.ref[PixfeedLoader]") -> None:
        self.loader = loader

    def _batches(self) -> BatchSampler:
        loader = self.loader()
        return BatchSampler(_After(loader.sampler, loader.pixfeed_skip), loader.batch_size, loader.drop_last)

    def __iter__(self) -> Iterator[List[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


class _After(Sampler):
    def __init__(self, sampler: Any, skip: int) -> None:
        self.sampler, self.skip = sampler, skip

    def __iter__(self) -> Iterator[int]:
        return islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)


def build_loader(
    dataset: Any,
    batch_size: int,
    *,
    shuffle: Optional[bool] = None,
    drop_last: bool = False,
    num_workers: Auto = "auto",
    pin_memory: Auto = "auto",
    persistent_workers: Auto = "auto",
    prefetch_factor: Auto = "auto",
    read_ahead: Auto = "auto",
    seed: Optional[int] = None,
    distributed: Distributed = "auto",
    stall_timeout: float = rules.STALL_TIMEOUT,
    order: str = "auto",
    io_ahead: Auto = "auto",
    io_depth: Auto = "auto",
    decode_threads: Auto = "auto",
    training_threads: Auto = "auto",
    memory_format: torch.memory_format = torch.channels_last,
    sampler: Optional[Sampler] = None,
    collate_fn: Optional[Callable[[List[Any]], Any]] = None,
    on_error: str = "raise",
) -> PixfeedLoader:
    """``make_loader`` with its settings as given (``num_workers`` a number or "auto"): what the
    tuner builds its candidates with."""
    memory_format = rules.check_memory_format(memory_format)
    require_int("batch_size", batch_size, 1)
    if seed is not None:
        require_int("seed", seed, 0)
    _check_batchable(dataset, batch_size)
    if isinstance(dataset, IterableDataset) and hasattr(dataset, "worker_batch"):
        dataset.worker_batch = batch_size  # each worker yields whole batches but one: len(loader) batches
    world = World.detect(distributed)
    rules.check_sampler(sampler, collate_fn, dataset, world, distributed, shuffle, order, io_ahead, memory_format)
    extents = _record_extents(dataset)
    hinted = None if io_ahead in (0, False) or sampler is not None else extents  # what read-ahead may request
    plan = plan_loader(dataset, batch_size, world, drop_last, num_workers, pin_memory,
                       persistent_workers, prefetch_factor, read_ahead, decode_threads, training_threads)
    plan.stall_timeout, plan.reasons["stall_timeout"] = rules.choose_stall_timeout(stall_timeout)
    plan.memory_format, plan.reasons["memory_format"] = rules.layout(memory_format)
    plan.sampler, plan.collate_fn, more = rules.user_sampler(sampler, collate_fn)
    plan.reasons.update(more)
    plan.on_error, plan.reasons["on_error"] = rules.choose_on_error(on_error, dataset)
    if plan.on_error == "skip":
        plan.skips, plan.reasons["skipped"] = SkipLog(plan.num_workers), "damaged records skipped so far, all workers"
    cacheplan.plan_memory(plan, dataset, hinted, io_ahead, order, shuffle, batch_size, io_depth)
    if sampler is not None:
        plan.order, plan.reasons["order"] = "sampler", f"{plan.sampler}'s (sampler=)"
    epochplan.prepare(plan, dataset, extents)
    if plan.sharing_strategy != torch.multiprocessing.get_sharing_strategy():
        torch.multiprocessing.set_sharing_strategy(plan.sharing_strategy)
    source = BatchReader(dataset, plan.decode_threads) if plan.path == "batch" else dataset
    if not isinstance(dataset, IterableDataset):
        source, plan.seeding, plan.reasons["seeding"] = seeded(source, dataset, seed)
    else:
        plan.seeding, plan.reasons["seeding"] = iterable_seeding(dataset, plan.num_workers)
    if isinstance(dataset, IterableDataset) and hasattr(dataset, "skips"):
        dataset.skips = plan.skips  # pixfeed's WebDataset reader leaves damaged records out (None: raise)
    elif plan.skips is not None:
        source = SkipDamaged(source, dataset, plan.skips)
    loader = PixfeedLoader(
        source,
        batch_size=batch_size,
        drop_last=drop_last,
        pixfeed_plan=plan,
        distributed=distributed,
        **_ordering(source, plan, shuffle, drop_last, seed, distributed, hinted,
                    Collate(plan.path == "batch", fields=_has_fields(source), memory_format=memory_format,
                            user=collate_fn), sampler),
        **_workers(plan, seed),
    )
    fetchplan.attach(loader, dataset, hinted)  # a bucket dataset read through chunks: fetch in this order
    if callable(getattr(dataset, "plan_sources", None)):  # a mixture (pixfeed.mix): its epochs follow the seed
        dataset.use_seed(seed or 0)
        plan.reasons["path"] = "\n".join([plan.reasons["path"], *dataset.plan_sources()])
    return loader


def _record_extents(dataset: Any) -> Optional[Extents]:
    """Where the dataset's records lie in its files (pixfeed's map-style readers), else None."""
    if isinstance(dataset, IterableDataset) or not callable(getattr(dataset, "record_extents", None)):
        return None
    return dataset.record_extents()


def _check_batchable(dataset: Any, batch_size: int) -> None:
    """Refuse, before any worker starts, a pixfeed dataset whose images cannot share a batch."""
    if batch_size > 1 and getattr(dataset, "transform", False) is None and hasattr(dataset, "fixed_shape") \
            and dataset.fixed_shape is None and getattr(dataset, "default_fields", True):
        raise OptionError(f"{dataset.path}: its encoded images have different sizes and cannot be batched; "
                          "open it with size=224 (or HxW), crop='random' for training, or a transform that "
                          "resizes")


def plan_loader(dataset: Any, batch_size: int, world: World, drop_last: bool, num_workers: Auto,
                pin_memory: Auto, persistent_workers: Auto, prefetch_factor: Auto, read_ahead: Auto,
                decode_threads: Auto = "auto", training_threads: Auto = "auto") -> LoaderPlan:
    reasons: Dict[str, str] = {}

    def take(name: str, choice: rules.Choice) -> Any:
        value, reasons[name] = choice
        return value

    cpus = available_cpus()
    path = take("path", rules.choose_path(dataset))
    batches = rules.batches_per_rank(dataset, batch_size, world, drop_last)
    shards = rules.shards_per_rank(dataset, world)
    read_cost = read_seconds(dataset) if rules.measures_reads(num_workers, dataset, path, cpus) else None
    workers = take("num_workers", rules.choose_workers(num_workers, dataset, path, cpus, batches, shards, read_cost))
    if shards is not None and workers > shards:
        dataset.warn_shared_shards = False  # said here (or chosen by the plan), not again in a worker
    if shards is not None and workers > shards and num_workers != "auto":
        name = getattr(dataset, "path", type(dataset).__name__)
        warn_caller(f"pixfeed: {name}: each rank reads {shards} shard(s) with {workers} DataLoader workers, "
                      f"so every worker reads them all and keeps 1 sample in {workers}; pack with a smaller "
                      f"--shard-size to give each worker whole shards, or make the loader with num_workers={shards}")
    sample = sample_bytes(dataset, workers)
    batch_bytes = None if sample is None else sample * batch_size
    prefetch = take("prefetch_factor", rules.choose_prefetch(prefetch_factor, workers, batch_bytes))
    if workers and batch_bytes is not None:
        asked = num_workers != "auto" or prefetch_factor != "auto" or persistent_workers is True
        workers, prefetch = fit_shared_memory(reasons, batch_bytes, workers, prefetch, asked)
    strategy = take("sharing_strategy", choose_strategy(workers, prefetch or 0))
    threads = take("decode_threads", rules.choose_decode_threads(decode_threads, dataset, path, workers, cpus))
    return LoaderPlan(
        path=path,
        num_workers=workers,
        decode_threads=threads,
        training_threads=take("training_threads", rules.choose_training_threads(training_threads, workers, cpus)),
        read_ahead=take("read_ahead", rules.choose_read_ahead(read_ahead, workers, torch.cuda.is_available())),
        pin_memory=take("pin_memory", rules.choose_pin_memory(pin_memory)),
        persistent_workers=take("persistent_workers", rules.choose_persistent(persistent_workers, workers, dataset)),
        prefetch_factor=prefetch,
        sharing_strategy=strategy,
        world=world,
        cpus=cpus,
        batch_bytes=batch_bytes,
        reasons=reasons,
    )


def _ordering(source: Any, plan: LoaderPlan, shuffle: Optional[bool], drop_last: bool, seed: Optional[int],
              distributed: Distributed, extents: Optional[Extents], collate_fn: Collate,
              sampler: Optional[Sampler]) -> Dict[str, Any]:
    if sampler is not None:  # the caller's: check_sampler refused what it cannot honour
        return {"sampler": sampler, "collate_fn": collate_fn}
    if isinstance(source, IterableDataset):
        _order_iterable(source, shuffle, seed)
        return {"collate_fn": collate_fn}
    kind = RecordedSampler if distributed is False else SplitSampler  # False: a framework's split wraps it
    sampler = kind(source, distributed=distributed, shuffle=True if shuffle is None else shuffle, seed=seed or 0,
                   drop_last=drop_last)
    sampler.quasi = plan.quasi
    sampler.hints = Hinter(extents, plan.io_ahead, plan.drop_behind, plan.io_depth) if plan.io_ahead else None
    return {"sampler": sampler, "collate_fn": collate_fn}


def _has_fields(source: Any) -> bool:
    """Whether the (possibly wrapped) dataset returns fields other than (image, label)."""
    return not getattr(getattr(source, "dataset", source), "default_fields", True)


def _order_iterable(dataset: IterableDataset, shuffle: Optional[bool], seed: Optional[int]) -> None:
    """Hand ``shuffle``/``seed`` to an iterable dataset that takes them; refuse them for one that does not."""
    given = {name: value for name, value in (("shuffle", shuffle), ("seed", seed)) if value is not None}
    missing = [name for name in given if not hasattr(dataset, name)]
    if missing:
        raise OptionError(f"{type(dataset).__name__} is an IterableDataset without a {' or '.join(missing)} "
                          f"attribute: it orders its own samples, so make_loader cannot apply "
                          f"{', '.join(f'{name}={given[name]!r}' for name in missing)}; leave "
                          f"{' and '.join(missing)} out, or shuffle and seed inside the dataset")
    for name, value in given.items():
        setattr(dataset, name, value)


def _workers(plan: LoaderPlan, seed: int) -> Dict[str, Any]:
    return {
        "num_workers": plan.num_workers,
        "pin_memory": plan.pin_memory,
        "persistent_workers": plan.persistent_workers,
        "prefetch_factor": plan.prefetch_factor,
        "worker_init_fn": WorkerSeeder(plan.world.rank) if plan.num_workers else None,
        "generator": torch.Generator().manual_seed(seed or 0),
        "timeout": POLL if plan.num_workers else 0,  # each expiry checks on the workers (watchdog.py)
    }
