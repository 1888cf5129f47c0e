"""``ResumableSampler``: ``split.EpochSampler`` (torch's ``DistributedSampler`` order), startable
part-way through an epoch.

The epoch's order is ``DistributedSampler``'s: a permutation of the ``n``
indices drawn from ``seed + epoch`` (or ``0..n-1`` without shuffling),
repeated cyclically for padding, ``stream[p] = order[p % n]``.  Rank ``r`` of
``W`` (this epoch's world, resolved by ``EpochSampler``) reads positions
``offset + r, offset + r + W, ...`` up to ``end``, where ``end - offset`` is
the multiple of ``W`` just above ``n - offset`` (``drop_last=False``: up to
``W - 1`` samples from the start of the order repeat) or just below it
(``drop_last=True``: up to ``W - 1`` left out).  With ``offset = 0`` this is
exactly ``DistributedSampler``.

``offset`` (``start`` in a loader's state) is the number of stream positions
all ranks together consumed before a resume.  Ranks read in lock step, so when
every rank has consumed ``k`` samples the consumed positions are exactly
``0 .. offset + k * W - 1``, whatever ``W`` is: a resume on ``W'`` ranks starts
at ``offset + k * W`` and splits what is left of the epoch evenly among the
``W'`` ranks.  No sample is lost or repeated, apart from the padding above;
with the same ``W`` the remaining positions of every rank are exactly those it
would have read.

``quasi = (chunk, window)`` replaces the full shuffle with ``order.quasi_random``
(drawn from the same generator), for datasets larger than memory.  ``hints``
(a ``readahead.Hinter``) asks storage for the records of the next batches
while the indices are handed out (``follow``).
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import numpy as np
import torch

from pixfeed.loaders.order import as_ints, quasi_random
from pixfeed.loaders.readahead import Hinter
from pixfeed.loaders.split import EpochSampler


class ResumableSampler(EpochSampler):
    """``EpochSampler(dataset, distributed, shuffle, seed, drop_last)`` plus ``offset``."""

    def __init__(self, dataset, **options) -> None:
        super().__init__(dataset, **options)
        self.offset = 0
        self.quasi: Optional[Tuple[int, int]] = None
        self.hints: Optional[Hinter] = None

    def epoch_order(self) -> np.ndarray:
        """The epoch's order of all ``n`` indices, the same on every rank (int32 below 2**31 records: no
        Python object per index)."""
        n = len(self.dataset)
        dtype = np.int32 if n < 2**31 else np.int64  # torch draws the same permutation in either
        if not self.shuffle:
            return np.arange(n, dtype=dtype)
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        if self.quasi is not None:
            return quasi_random(n, *self.quasi, generator).astype(dtype, copy=False)
        return torch.randperm(n, generator=generator, dtype=torch.int32 if dtype == np.int32 else torch.int64).numpy()

    @property
    def end(self) -> int:
        """The stream position after the last one any rank reads this epoch."""
        left, world = max(len(self.dataset) - self.offset, 0), self.num_replicas
        per_rank = left // world if self.drop_last else -(-left // world)
        return self.offset + per_rank * world

    def __len__(self) -> int:
        self._resize()  # this epoch's world
        return (self.end - self.offset) // self.num_replicas

    def indices(self) -> np.ndarray:
        """This rank's indices for the rest of the epoch."""
        self._resize()
        order = self.epoch_order()
        start, end, step, n = self.offset + self.rank, self.end, self.num_replicas, len(order)
        mine = order[start:min(end, n):step]  # a view: no copy of the order
        if end <= n or not n:
            return mine
        wrapped = np.arange(max(start, n + (start - n) % step), end, step) % n  # padding: the order's start again
        return np.concatenate([mine, order[wrapped]])

    def follow(self, indices: np.ndarray) -> Iterator[int]:
        """Hand out ``indices`` as ints, reading ahead of them when ``hints`` is set."""
        return self.hints.follow(indices) if self.hints is not None else as_ints(indices)

    def __iter__(self) -> Iterator[int]:
        return self.follow(self.indices())
