"""Splitting an epoch by rank, decided when the epoch starts.

``make_loader`` cannot know, when it runs, whether the process group will
exist by the first epoch (Lightning creates it inside ``trainer.fit``) or
whether a framework will rebuild the DataLoader and split batches itself
(Accelerate's ``prepare``).  So the split is decided per epoch, by whoever
drives it:

* ``PixfeedLoader`` resolves ``World.detect(distributed)`` at the start of
  every epoch (and for ``len``) and hands it to its sampler (``use``) or to an
  iterable dataset's ``rank``/``world_size`` (``split_iterable``).
* A library that rebuilds the DataLoader around pixfeed's sampler calls the
  sampler's ``set_epoch`` and iterates it without ``PixfeedLoader``; the
  sampler then resolves ``World.detect(distributed, wrapped=True)``: a single
  process under Accelerate (whose prepared loader splits the batches), the
  process group's world otherwise.

pixfeed's sampler is a ``DistributedSampler`` when pixfeed splits
(``distributed`` "auto" or True: ``sampler.SplitSampler``), so Lightning keeps
it instead of injecting its own, and calls its ``set_epoch`` each epoch; that
epoch number is the one the loader uses next (``requested``), so a
framework's epoch count (a resumed run's too) decides the order.  With
``distributed=False`` it is a plain ``Sampler`` (``EpochSampler``): a
framework that splits by rank (Lightning, always when predicting) wraps it in
its own ``DistributedSampler`` and splits once.

``split_warning`` says when pixfeed cannot tell and names the fix: an epoch
that starts with no process group while ``WORLD_SIZE`` says there are several
ranks, or a framework's ``DistributedSampler`` in place of pixfeed's that would
split a second time.
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional

from torch.utils.data import DistributedSampler, IterableDataset, Sampler

from pixfeed.console.warn import warn_caller
from pixfeed.machine.world import Distributed, World


class EpochSampler(Sampler):
    """``DistributedSampler``'s attributes and epoch, with ``num_replicas`` and ``rank`` resolved when an epoch
    starts. Not itself a ``DistributedSampler``: ``SplitSampler`` (``distributed`` "auto" or True) is one, so
    that frameworks keep it; with ``distributed=False`` they inject their own split around it."""

    def __init__(self, dataset: Any, *, distributed: Distributed, shuffle: bool, seed: int, drop_last: bool) -> None:
        self.dataset, self.shuffle, self.seed, self.drop_last = dataset, shuffle, seed, drop_last
        self.epoch, self.num_replicas, self.rank = 0, 1, 0
        self.distributed = distributed
        self.requested: Optional[int] = None  # an epoch set from outside since the loader last started one
        self._world: Optional[World] = None  # the driving PixfeedLoader's; None: resolve as wrapped
        self.num_samples = self.total_size = len(dataset)  # one replica until an epoch resolves the world

    def use(self, world: World) -> None:
        """Split for ``world`` until a wrapper calls ``set_epoch`` (the PixfeedLoader drives)."""
        self._world = world

    def start(self, epoch: int) -> None:
        """The PixfeedLoader starts epoch ``epoch`` (after ``use``)."""
        self.epoch, self.requested = epoch, None

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.requested, self._world = epoch, epoch, None

    def _resize(self) -> None:
        world = self._world or World.detect(self.distributed, wrapped=True)
        n = len(self.dataset)
        self.num_replicas, self.rank = world.size, world.rank
        self.num_samples = n // world.size if self.drop_last else math.ceil(n / world.size)  # as torch's
        self.total_size = self.num_samples * world.size


def split_iterable(dataset: IterableDataset, world: World) -> None:
    """Give an iterable dataset this epoch's rank and world size, or warn that it cannot take them."""
    if hasattr(dataset, "rank") and hasattr(dataset, "world_size"):
        dataset.rank, dataset.world_size = world.rank, world.size
    elif world.size > 1:
        warn_caller(f"{type(dataset).__name__} has no rank/world_size attributes: unless it splits "
                      "its data by rank itself, every rank will read every sample", RuntimeWarning)


def split_warning(sampler: Any, distributed: Distributed, world: World) -> str:
    """Why this epoch is likely split zero times or twice, with the fix; '' when it is not."""
    size = os.environ.get("WORLD_SIZE", "1")
    if world.size == 1 and distributed == "auto" and size.isdigit() and int(size) > 1:
        return (f"WORLD_SIZE={size} in the environment, but no torch.distributed process group was initialised "
                "when this epoch started: every rank reads the whole dataset. Call init_process_group before the "
                "first epoch (Lightning and Accelerate do), pass distributed=True to split by RANK and WORLD_SIZE, "
                "or distributed=False if something else splits the data by rank")
    if world.size > 1 and distributed is not False and isinstance(sampler, DistributedSampler) \
            and not isinstance(sampler, EpochSampler):
        return (f"this loader's sampler is a {type(sampler).__name__} (a framework's, such as Lightning's when "
                "predicting), which splits by rank itself; if it wraps pixfeed's sampler, every epoch is split "
                "twice: make the loader with distributed=False")
    return ""
