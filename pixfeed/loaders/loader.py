"""``make_loader``: a real ``torch.utils.data.DataLoader`` with every "auto" option resolved.

The rules live in ``plan.py`` (and ``shm.py`` for shared memory); the result
is attached as ``loader.pixfeed_plan`` and prints as a table of choices and reasons.

Order and epochs: map-style datasets always go through torch's
``DistributedSampler`` (with one replica when not distributed), so the order
of epoch ``e`` is a function of ``(seed, e)`` alone.  ``PixfeedLoader`` calls
``set_epoch`` on the sampler, and on the dataset when it has one, each time
iteration starts, counting epochs itself; call ``loader.set_epoch(e)`` to
resume at epoch ``e``.

Distributed padding: with ``drop_last=False`` the sampler repeats the first
``(-len(dataset)) % world_size`` samples of the epoch's order so that every
rank gets ``ceil(len / world_size)`` samples and the same number of batches;
those few samples are seen twice.  With ``drop_last=True`` up to
``world_size - 1`` samples are left out instead and the last partial batch is
dropped, so no sample is seen twice.  Iterable datasets split themselves by
rank; ``make_loader`` gives them ``rank`` and ``world_size`` when they have
those attributes.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, Iterator, Optional

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from pixfeed.cpus import available_cpus
from pixfeed.errors import OptionError, require_int
from pixfeed.loaders import plan as rules
from pixfeed.loaders.batch import BatchReader, ReadAhead, pass_through
from pixfeed.loaders.collate import collate
from pixfeed.loaders.plan import Auto, LoaderPlan
from pixfeed.loaders.probe import sample_bytes
from pixfeed.loaders.seeding import WorkerSeeder
from pixfeed.loaders.shm import fall_back_to_file_system, plan_sharing, shm_free_bytes
from pixfeed.world import Distributed, World


class PixfeedLoader(DataLoader):
    """A DataLoader that starts each epoch with ``set_epoch`` and may read ahead in a thread."""

    def __init__(self, *args: Any, plan: LoaderPlan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pixfeed_plan = plan
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (to resume training)."""
        self.epoch = require_int("epoch", epoch, 0)

    def __iter__(self) -> Iterator[Any]:
        dataset = self.dataset.dataset if isinstance(self.dataset, BatchReader) else self.dataset
        for target in (self.sampler, dataset):
            if callable(getattr(target, "set_epoch", None)):
                target.set_epoch(self.epoch)
        self.epoch += 1
        batches = super().__iter__()
        return ReadAhead(batches) if self.pixfeed_plan.read_ahead else batches


def make_loader(
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
) -> PixfeedLoader:
    """A DataLoader for ``dataset``; see ``loader.pixfeed_plan`` for what was chosen and why.

    ``shuffle`` and ``seed`` (default True and 0) order a map-style dataset through the sampler.
    An iterable dataset orders its own samples: one with ``shuffle`` and ``seed`` attributes
    (pixfeed's WebDataset reader) is given the values passed here and otherwise keeps its own;
    any other iterable dataset refuses them.

    ``num_workers="tune"`` measures candidate settings first (``pixfeed.loaders.tune``)."""
    if num_workers == "tune":
        from pixfeed.loaders.tune import tuned_loader  # tune builds its candidates with make_loader
        return tuned_loader(dataset, batch_size, shuffle=shuffle, drop_last=drop_last, pin_memory=pin_memory,
                            persistent_workers=persistent_workers, prefetch_factor=prefetch_factor,
                            read_ahead=read_ahead, seed=seed, distributed=distributed)
    require_int("batch_size", batch_size, 1)
    if seed is not None:
        require_int("seed", seed, 0)
    _check_batchable(dataset, batch_size)
    world = World.detect(distributed)
    plan = plan_loader(dataset, batch_size, world, drop_last, num_workers, pin_memory,
                       persistent_workers, prefetch_factor, read_ahead)
    if plan.sharing_strategy == "file_system":
        fall_back_to_file_system(plan.num_workers * (plan.batch_bytes or 0), shm_free_bytes())
    source = BatchReader(dataset) if plan.path == "batch" else dataset
    return PixfeedLoader(
        source,
        batch_size=batch_size,
        drop_last=drop_last,
        plan=plan,
        **_ordering(source, plan, shuffle, drop_last, seed),
        **_workers(plan, seed),
    )


def _check_batchable(dataset: Any, batch_size: int) -> None:
    """Refuse, before any worker starts, a pixfeed dataset whose images cannot share a batch."""
    if batch_size > 1 and getattr(dataset, "transform", False) is None and hasattr(dataset, "fixed_shape") \
            and dataset.fixed_shape is None:
        raise OptionError(f"{dataset.path}: its encoded images have different sizes and cannot be batched; "
                          "open it with size=224 (or HxW), crop='random' for training, or a transform that "
                          "resizes")


def plan_loader(dataset: Any, batch_size: int, world: World, drop_last: bool, num_workers: Auto,
                pin_memory: Auto, persistent_workers: Auto, prefetch_factor: Auto, read_ahead: Auto) -> LoaderPlan:
    reasons: Dict[str, str] = {}

    def take(name: str, choice: rules.Choice) -> Any:
        value, reasons[name] = choice
        return value

    cpus = available_cpus()
    path = take("path", rules.choose_path(dataset))
    batches = rules.batches_per_rank(dataset, batch_size, world, drop_last)
    workers = take("num_workers", rules.choose_workers(num_workers, dataset, path, cpus, batches))
    sample = sample_bytes(dataset, workers)
    batch_bytes = None if sample is None else sample * batch_size
    prefetch = take("prefetch_factor", rules.choose_prefetch(prefetch_factor, workers, batch_bytes))
    strategy = torch.multiprocessing.get_sharing_strategy()
    reasons["sharing_strategy"] = "no workers" if not workers else "batch size in bytes unknown"
    if workers and batch_bytes is not None:
        prefetch, strategy, reasons["sharing_strategy"] = plan_sharing(batch_bytes, workers, prefetch)
    return LoaderPlan(
        path=path,
        num_workers=workers,
        read_ahead=take("read_ahead", rules.choose_read_ahead(read_ahead)),
        pin_memory=take("pin_memory", rules.choose_pin_memory(pin_memory)),
        persistent_workers=take("persistent_workers", rules.choose_persistent(persistent_workers, workers, dataset)),
        prefetch_factor=prefetch,
        sharing_strategy=strategy,
        world=world,
        cpus=cpus,
        batch_bytes=batch_bytes,
        reasons=reasons,
    )


def _ordering(source: Any, plan: LoaderPlan, shuffle: Optional[bool], drop_last: bool,
              seed: Optional[int]) -> Dict[str, Any]:
    collate_fn = pass_through if plan.path == "batch" else collate
    if isinstance(source, IterableDataset):
        _order_iterable(source, shuffle, seed)
        _split_iterable(source, plan.world)
        return {"collate_fn": collate_fn}
    sampler = DistributedSampler(source, num_replicas=plan.world.size, rank=plan.world.rank,
                                 shuffle=True if shuffle is None else shuffle, seed=seed or 0, drop_last=drop_last)
    return {"sampler": sampler, "collate_fn": collate_fn}


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


def _split_iterable(dataset: IterableDataset, world: World) -> None:
    if world.size == 1:
        return
    if hasattr(dataset, "rank") and hasattr(dataset, "world_size"):
        dataset.rank, dataset.world_size = world.rank, world.size
    else:
        warnings.warn(f"{type(dataset).__name__} has no rank/world_size attributes: unless it splits "
                      "its data by rank itself, every rank will read every sample", RuntimeWarning, stacklevel=4)


def _workers(plan: LoaderPlan, seed: int) -> Dict[str, Any]:
    return {
        "num_workers": plan.num_workers,
        "pin_memory": plan.pin_memory,
        "persistent_workers": plan.persistent_workers,
        "prefetch_factor": plan.prefetch_factor,
        "worker_init_fn": WorkerSeeder(plan.world.rank) if plan.num_workers else None,
        "generator": torch.Generator().manual_seed(seed or 0),
    }
