"""``StreamMixture``: WebDataset packs mixed by interleaving their streams, with the quotas of ``quotas.py``.

An epoch of ``N = sum(quotas)`` samples is a schedule of ``N`` source ids, each source's id its quota
times, shuffled from (seed, epoch) (``shuffle=False``: each source's samples spread evenly).  The
``c``-th place of source ``s`` in the schedule is sample ``c`` of that source's stream for the epoch:
its shards in an order drawn from (seed, epoch, source, pass), read front to back, and read again
in a new order (the next pass) while its quota is not met; a quota below the source's size is the
first ``q`` samples of that order (no choice of samples within a shard order: a stream has no
random access).

The schedule is split as one WebDataset's stream is (``pixfeed.datasets.wds``): rank ``r`` reads the
``r``-th of ``world_size`` contiguous ranges of ``N // world_size`` places (the last ``N %
world_size`` left out), and each DataLoader worker a contiguous range of it, whole batches of
``worker_batch`` but one, so the loader yields ``len(loader)`` batches.  A range of the schedule is
a contiguous range of each source's stream: a worker reads each source from one place on (walking
past the first samples of at most one shard per source and pass).  Then, as in one WebDataset: a
shuffle buffer per worker seeded from (seed, epoch, rank, worker), a resume that skips a worker's
first samples without decoding them, damaged records left out with ``on_error="skip"``.  Random
crops and transforms draw from (seed, source, pass, record), so a record read twice in an epoch
gets two crops.  A source's own ``shuffle``, ``buffer``, ``seed``, rank and world are not used: the
mixture's are.
"""
from __future__ import annotations

import random
from contextlib import nullcontext
from itertools import islice
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info
from webdataset import shuffle as buffer_shuffle

from ..datasets.wds import SKIPPED, WdsImageDataset, cut, worker_range
from ..machine.world import World
from ..seeds import sample_rngs, seeded_by_index
from .dataset import Mixed

MIX = 0x6D6978  # "mix": keeps the mixture's draws apart from a source's own


class StreamMixture(Mixed, IterableDataset):
    """``pixfeed.mix`` of WebDataset packs (module docstring); ``len`` is the samples this rank yields an epoch."""

    def __init__(self, sources: Sequence[Any], weights: Optional[Sequence[float]] = None, *, shuffle: bool = True,
                 buffer: Optional[int] = None, **options: Any):
        super().__init__(sources, weights, streams=True, **options)
        self.shuffle = shuffle
        self.buffer = max(getattr(s, "buffer", 0) for s in self.sources) if buffer is None else int(buffer)
        self._follow_world()
        self.worker_batch = 1  # samples a DataLoader worker collates together (make_loader: its batch_size)
        self._resume = None
        self._skips = None
        self._schedule: Tuple[Any, Optional[np.ndarray]] = (None, None)
        self._passes = [max(1, -(-q // n)) for q, n in zip(self.quotas, self.lengths)]  # a source's passes an epoch

    @property
    def skips(self):
        """make_loader(on_error="skip")'s log, handed to every source (each leaves its damaged records out)."""
        return self._skips

    @skips.setter
    def skips(self, log) -> None:
        self._skips = log
        for source in self.sources:
            source.skips = log

    def __len__(self) -> int:
        return sum(self.quotas) // self.world_size

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._follow_world()

    def _follow_world(self) -> None:
        """This process's rank and world size (torch.distributed's; a make_loader loader sets them each epoch)."""
        world = World.detect("auto", wrapped=True)
        self.rank, self.world_size = world.rank, world.size

    @property
    def fixed_shape(self) -> Optional[Tuple[int, int, int]]:
        shapes = {getattr(s, "fixed_shape", None) for s in self.sources}
        return shapes.pop() if len(shapes) == 1 else None

    def resume(self, epoch: int, worker_consumed: Optional[List[int]], first_worker: int = 0) -> None:
        """As ``WdsImageDataset.resume``: each worker skips the first ``worker_consumed[w]`` samples of its stream."""
        self._resume = None if worker_consumed is None else (int(epoch), list(worker_consumed), int(first_worker))

    def worker_counts(self, workers: int) -> List[int]:
        """Samples each of ``workers`` DataLoader workers yields this epoch on this rank."""
        return [stop - first for first, stop in (self._range(w, workers) for w in range(workers))]

    def schedule(self) -> np.ndarray:
        """The epoch's source ids, one per sample, in the order they are read (before the shuffle buffer)."""
        key = (self.seed, self.epoch, self.shuffle)
        if self._schedule[0] != key:
            ids = np.repeat(np.arange(len(self.sources), dtype=np.int32), self.quotas)
            if self.shuffle:
                ids = np.random.default_rng([self.seed, MIX, self.epoch]).permutation(ids)
            else:  # source s's k-th sample at (k + 1/2) / q_s of the epoch
                places = np.concatenate([(np.arange(q) + 0.5) / q for q in self.quotas if q])
                ids = ids[np.argsort(places, kind="stable")]
            self._schedule = (key, ids)
        return self._schedule[1]

    def _range(self, worker: int, workers: int) -> Tuple[int, int]:
        """(first, stop) places of the schedule that ``worker`` of ``workers`` reads on this rank."""
        first, stop = worker_range(len(self), self.worker_batch, worker, workers)
        return self.rank * len(self) + first, self.rank * len(self) + stop

    def _pieces(self, s: int, first: int, stop: int) -> Iterator[Tuple[int, list]]:
        """(pass, pieces as ``WdsImageDataset._select`` takes them) of source ``s``'s stream, samples
        ``first`` to ``stop - 1`` of the epoch."""
        ds, n = self.sources[s], self.lengths[s]
        for p in range(first // n, -(-stop // n)):
            order = np.arange(len(ds.shards))
            if self.shuffle:
                order = np.random.default_rng([self.seed, MIX, self.epoch, s, p]).permutation(order)
            whole = [(int(k), 0, ds.shards[k]["count"]) for k in order]
            yield p, cut(whole, max(first - p * n, 0), min(stop - p * n, n))

    def _read(self, s: int, first: int, stop: int) -> Iterator[tuple]:
        """(source, pass, shard, record, stored sample) of source ``s``'s stream, samples ``first`` to ``stop - 1``."""
        ds = self.sources[s]
        paths = ds.shard_paths()
        for p, pieces in self._pieces(s, first, stop):
            for shard, i, sample in ds._select(paths, pieces, 1, 0):
                yield s, p, shard, i, sample

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        worker, skip = WdsImageDataset._resumed(self, worker, workers)  # the same rule as one WebDataset
        first, stop = self._range(worker, workers)
        schedule, count = self.schedule(), len(self.sources)
        before = np.bincount(schedule[:first], minlength=count)
        mine = schedule[first:stop]
        reads = np.bincount(mine, minlength=count)
        streams = [self._read(s, int(before[s]), int(before[s] + reads[s])) for s in range(count)]
        records = (next(streams[s]) for s in mine.tolist())
        if self.shuffle and self.buffer > 1:
            key = np.random.SeedSequence([self.seed, self.epoch, self.rank, worker, MIX]).generate_state(1, np.uint64)
            records = buffer_shuffle(self.buffer, initial=self.buffer, rng=random.Random(int(key[0])))(records)
        for s, p, shard, i, sample in islice(records, skip, None):
            ds, draw = self.sources[s], (self.epoch * self._passes[s] + p) * count + s
            with seeded_by_index(self.seed, draw), \
                    (sample_rngs(self.seed, draw, i) if ds.transform is not None else nullcontext()):
                item = ds._decode_or_skip(shard, i, sample)
            if item is not SKIPPED:
                yield self._relabel(item, s)
