"""``loader.state_dict()`` / ``load_state_dict(state)``: stop mid-epoch, resume exactly.

The state is a small JSON-serialisable dict (no pickle)::

    pixfeed_loader_state  1, the version of this layout
    dataset               xxh3_64 of the dataset's manifest (of its type and length for other datasets)
    layout_version        the dataset's pixfeed layout version (null for other datasets)
    seed, shuffle, drop_last   as the loader was made; a state is refused by a loader made otherwise
    order                 "random", or [chunk, window] of order="quasi_random" (sizes that depend on the
                          machine's memory: a loader made with order="quasi_random" adopts the saved ones)
    epoch                 the epoch to read next (resumed part-way when consumed > 0)
    world_size, rank      of the rank that saved it
    start                 map-style: stream positions all ranks had consumed before this
                          stretch of the epoch (``sampler.py``)
    consumed              samples this rank handed to the training loop in this stretch
                          (batches actually yielded; batches in flight or prefetched do not count)
    workers, worker_consumed, next_worker    WebDataset only (below)
    skipped               damaged records skipped so far (``on_error="skip"`` only)

A caller's ``sampler=`` (``order`` is then "sampler NAME", ``shuffle`` null): it
splits by rank itself, so ``start + consumed`` counts this rank's positions in
its iteration, and a resume skips that many of its indices in the sampler's
next iteration (``loader._ResumedBatches``); another sampler or world size is
refused.

Map-style datasets resume exactly for the same world size: the sampler starts at
``start + consumed * world_size`` and every random draw depends on (seed, epoch,
sample) only (``seeding.py``), so the remaining batches are the ones the
uninterrupted run would have read, whatever ``num_workers`` and
``prefetch_factor``.  With another world size the unconsumed rest of the epoch is
split evenly among the new ranks.  This assumes that all ranks saved their state
at the same step (as synchronous data-parallel training does).

WebDataset (an iterable dataset) resumes exactly for the same world size and
``num_workers``; others are refused with an error saying what to pass.  The
DataLoader takes batches from its workers in turn, skipping a worker that has
run out, so the batches handed out say how many samples each worker produced;
on resume each worker skips that many samples of its (shuffled) stream before
decoding, and the worker that was next in turn is read first.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, Optional

from torch.utils.data import IterableDataset

from pixfeed.checksum import record_hash
from pixfeed.errors import OptionError
from pixfeed.loaders.batch import BatchReader
from pixfeed.loaders.damaged import SkipDamaged
from pixfeed.loaders.seeding import SeededSamples
from pixfeed.loaders.split import EpochSampler

STATE_VERSION = 1
Point = Dict[str, Any]  # where an epoch starts: {"start": n} or the WebDataset worker fields


class Progress:
    """Which epoch is being read, from which point, and how many batches the user has taken."""

    def __init__(self) -> None:
        self.epoch: Optional[int] = None
        self.point: Point = {}
        self.batches = 0
        self.finished = False
        self.generation = 0  # which iteration counts: an older epoch's iterator counts for nothing

    def track(self, batches: Iterator[Any], epoch: int, point: Point) -> Iterator[Any]:
        self.epoch, self.point, self.batches, self.finished = epoch, point, 0, False
        self.generation += 1
        return Counted(batches, self)


class Counted(Iterator[Any]):
    """The epoch's batches, counted as the training loop takes them; ``len`` as the DataLoader's.

    ``Progress`` keeps no reference to it: a cycle would leave the DataLoader's iterator to the garbage
    collector, which may close its queues before it stops its workers (each then takes 5 s to join)."""

    def __init__(self, batches: Iterator[Any], progress: Progress) -> None:
        self.batches, self.progress, self.generation = batches, progress, progress.generation

    def __next__(self) -> Any:
        try:
            batch = next(self.batches)
        except StopIteration:
            self.progress.finished |= self._current()
            raise
        self.progress.batches += self._current()
        return batch

    def _current(self) -> bool:
        return self.generation == self.progress.generation

    def __len__(self) -> int:
        return len(self.batches)


def user_dataset(loader: Any) -> Any:
    """The dataset given to make_loader, under the wrappers it may have put around it."""
    wrapped = isinstance(loader.dataset, (BatchReader, SeededSamples, SkipDamaged))
    return loader.dataset.dataset if wrapped else loader.dataset


def state_of(loader: Any) -> dict:
    dataset, progress = user_dataset(loader), loader.pixfeed_progress
    reading = progress.epoch is not None and not progress.finished
    iterable = isinstance(dataset, IterableDataset)
    ordering = dataset if iterable else loader.sampler if own_sampler(loader) else None  # None: the caller's
    state = {"pixfeed_loader_state": STATE_VERSION, **_identity(dataset),
             "seed": getattr(loader.dataset, "seed", None) if ordering is None else ordering.seed,
             "shuffle": None if ordering is None else ordering.shuffle, "drop_last": loader.drop_last,
             "order": f"sampler {type(loader.sampler).__name__}" if ordering is None else
             list(getattr(ordering, "quasi", None) or []) or "random",
             "epoch": progress.epoch if reading else loader.epoch,
             "world_size": loader.pixfeed_plan.world.size, "rank": loader.pixfeed_plan.world.rank,
             **({} if loader.pixfeed_plan.skips is None else {"skipped": loader.pixfeed_plan.skipped})}
    point = progress.point if reading else loader.pixfeed_resume_point or {}
    batches = progress.batches if reading else 0
    if iterable:
        return {**state, **_advance_workers(loader, dataset, point, batches)}
    consumed = min(batches * loader.batch_size, len(loader.sampler)) if reading else 0
    return {**state, "start": point.get("start", 0), "consumed": consumed}


def load(loader: Any, state: Any) -> None:
    """Check ``state`` against this loader and make the next iteration continue from it."""
    dataset = user_dataset(loader)
    iterable = isinstance(dataset, IterableDataset)
    _check(loader, dataset, state, iterable)
    loader.set_epoch(state["epoch"])
    if loader.pixfeed_plan.skips is not None and isinstance(state.get("skipped"), int):
        loader.pixfeed_plan.skips.base = state["skipped"]  # the count goes on from the saved run's
    if iterable:
        point = {name: state[name] for name in ("workers", "worker_consumed", "next_worker")}
    elif not own_sampler(loader):  # the caller's sampler splits by rank itself: skip what this rank took
        point = {"start": state["start"] + state["consumed"]}
        loader.pixfeed_skip = point["start"]
    else:
        point = {"start": state["start"] + state["consumed"] * state["world_size"]}
        loader.sampler.offset = point["start"]
        loader.sampler.quasi = tuple(state["order"]) if state["order"] != "random" else None
    loader.pixfeed_resume_point = point
    loader.pixfeed_progress = Progress()
    loader._iterator = None  # persistent workers hold the old epoch's copy of the dataset: start new ones


def begin_epoch(loader: Any, epoch: int) -> Point:
    """Apply a loaded resume point (once) to the epoch about to be read; return it."""
    point, loader.pixfeed_resume_point = loader.pixfeed_resume_point or {}, None
    dataset = user_dataset(loader)
    if isinstance(dataset, IterableDataset):
        if callable(getattr(dataset, "resume", None)):
            dataset.resume(epoch, point.get("worker_consumed"), point.get("next_worker", 0))
    elif own_sampler(loader):
        loader.sampler.offset = point.get("start", 0)
    else:
        loader.pixfeed_skip = point.get("start", 0)
    return point


def own_sampler(loader: Any) -> bool:
    """Whether a map-style loader reads in pixfeed's order (not a caller's ``sampler=``)."""
    return isinstance(loader.sampler, EpochSampler)


def _identity(dataset: Any) -> dict:
    if isinstance(getattr(dataset, "fingerprint", None), str):  # a mixture: its sources, quotas and labels
        return {"dataset": dataset.fingerprint, "layout_version": None}
    manifest = getattr(dataset, "manifest", None)
    if isinstance(manifest, dict):
        text = json.dumps(manifest, sort_keys=True).encode()
        return {"dataset": f"{record_hash(text):016x}", "layout_version": manifest.get("layout_version")}
    text = f"{type(dataset).__module__}.{type(dataset).__qualname__}:{len(dataset)}".encode()
    return {"dataset": f"{record_hash(text):016x}", "layout_version": None}


def _advance_workers(loader: Any, dataset: Any, point: Point, batches: int) -> dict:
    """Worker fields after the user took ``batches`` more batches, in the DataLoader's turn order."""
    workers = max(loader.num_workers, 1)
    totals = dataset.worker_counts(workers)
    consumed = list(point.get("worker_consumed") or [0] * workers)
    turn = point.get("next_worker", 0)
    for _ in range(batches):
        for _ in range(workers):
            left = totals[turn] - consumed[turn]
            if left >= loader.batch_size or (left > 0 and not loader.drop_last):
                break
            turn = (turn + 1) % workers
        consumed[turn] += min(left, loader.batch_size)
        turn = (turn + 1) % workers
    return {"consumed": sum(consumed), "workers": workers, "worker_consumed": consumed, "next_worker": turn}


def _check(loader: Any, dataset: Any, state: Any, iterable: bool) -> None:
    if not isinstance(state, dict) or state.get("pixfeed_loader_state") != STATE_VERSION:
        raise OptionError(f"load_state_dict: not a pixfeed loader state of version {STATE_VERSION} "
                          f"(got {str(state)[:80]!r}); pass what loader.state_dict() returned")
    mine = state_of(loader)
    if state.get("dataset") != mine["dataset"]:
        raise OptionError(f"load_state_dict: the state was saved for another dataset (fingerprint "
                          f"{state.get('dataset')}, this one's is {mine['dataset']}: a different manifest); "
                          f"resume with the dataset the checkpoint was trained on")
    if state.get("layout_version") != mine["layout_version"]:
        raise OptionError(f"load_state_dict: the state was saved for pixfeed layout version "
                          f"{state.get('layout_version')}, this dataset is version {mine['layout_version']}")
    if str(state.get("order")).startswith("sampler") or str(mine["order"]).startswith("sampler"):
        if state.get("order") != mine["order"] or state.get("world_size") != mine["world_size"]:
            raise OptionError(f"load_state_dict: the state was saved with order {state.get('order')!r} on "
                              f"{state.get('world_size')} ranks, this loader has {mine['order']!r} on "
                              f"{mine['world_size']}; a caller's sampler resumes only as it was, on as many ranks")
    elif (state.get("order") == "random") != (mine["order"] == "random"):
        kind = lambda order: "random" if order == "random" else "quasi_random"  # noqa: E731
        raise OptionError(f"load_state_dict: the state was saved with order={kind(state.get('order'))!r}, this "
                          f"loader has order={kind(mine['order'])!r}; make the loader with "
                          f"order={kind(state.get('order'))!r}")
    for name in ("seed", "shuffle", "drop_last") + (("workers",) if iterable else ()):
        option = "num_workers" if name == "workers" else name
        if state.get(name) != mine[name]:
            raise OptionError(f"load_state_dict: the state was saved with {option}={state.get(name)!r}, this "
                              f"loader has {option}={mine[name]!r}; make the loader with {option}={state.get(name)!r}"
                              + (" (a WebDataset resumes only with the same number of ranks and num_workers)"
                                 if iterable else ""))
    if iterable and state.get("world_size") != mine["world_size"]:
        raise OptionError(f"load_state_dict: the state was saved by a run of {state.get('world_size')!r} ranks "
                          f"(the process group's size), this one has {mine['world_size']}; a WebDataset resumes "
                          "only on as many ranks as saved it: launch as many processes (torchrun --nproc-per-node), "
                          "or pack it as a map-style format (mmap, LMDB, HDF5) for elastic resume")
    for name in ("epoch", "start", "consumed") if not iterable else ("epoch", "next_worker"):
        if not isinstance(state.get(name), int) or isinstance(state.get(name), bool) or state[name] < 0:
            raise OptionError(f"load_state_dict: {name}={state.get(name)!r} must be a non-negative integer")
    if iterable and (not isinstance(state.get("worker_consumed"), list)
                     or len(state["worker_consumed"]) != state["workers"]):
        raise OptionError("load_state_dict: worker_consumed must list one count per worker")
