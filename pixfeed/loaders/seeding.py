"""Random seeds: per sample or per batch for map-style datasets, per worker for everything else.

Map-style datasets (``SeededSamples``, chosen by ``choose_seeding``): the
random numbers a dataset draws while it is read depend on the loader's
``seed``, the epoch and what is read only: not on which worker read it, how
many workers there are, the prefetch depth, or a resume that skipped the
samples before it.  Each epoch differs from the last, the same seed repeats.
How, by what the dataset says of itself:

* ``deterministic = True``: it draws nothing (pixfeed's datasets without
  ``crop="random"`` or a ``transform``); read as it is, no wrapper.
* ``rng_per_sample`` true (pixfeed's random crops without a ``transform``):
  every number comes from the record's own generator, seeded from (seed, epoch,
  index) (``pixfeed.seeds.seeded_by_index``), so a batch is still read in one
  call and each crop is a function of its sample alone.
* a user's dataset with its own ``__getitems__`` (one call per batch: a
  database query, one ranged GET): one call per batch, the global RNGs
  (Python's, NumPy's, torch's) seeded once from (seed, epoch, the batch's
  indices).  A resume is
  exact for the same batch size and world size (the batches are then the same
  sets of indices); on another world size the draws differ from an
  uninterrupted run's, still one per batch.
* any other dataset (pixfeed's readers with a ``transform`` included, so their
  draws do not depend on the batch size): each sample read alone with the global RNGs seeded from
  (seed, epoch, index) (``pixfeed.seeds.seed_rngs``).

The epoch lives in shared memory, so persistent workers see ``set_epoch``.
Without workers the reading happens in the training process, whose RNG states
are saved and restored around each batch; the process-wide RNGs are shared by
its threads, so with ``read_ahead=True`` (a reader thread running beside the
training loop) global draws stay seeded only if the training loop draws nothing
from them meanwhile (per-sample generators have no such limit).

Workers (``WorkerSeeder``): the DataLoader draws a base seed from its generator
(seeded with ``seed``) each time worker processes start; worker ``w`` sees
``torch.initial_seed() == base + w``.  ``WorkerSeeder`` mixes that with the
rank through NumPy's ``SeedSequence`` and seeds Python's ``random``, NumPy's
global RNG and torch's, so draws outside a sample's reading (an iterable
dataset's own) differ per worker, rank and epoch and repeat for the same seed.

Iterable datasets (``iterable_seeding``) are never wrapped: pixfeed's WebDataset
reader seeds each sample's crop or transform itself from (seed, epoch, record
index), so the plan says so ("per sample"); one that draws nothing is "none";
any other is seeded per worker by ``WorkerSeeder``, or not at all in process.
"""
from __future__ import annotations

import random
from typing import Any, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from pixfeed.datasets.base import ImageRecords
from pixfeed.loaders.batch import BatchReader
from pixfeed.loaders.collate import collate
from pixfeed.seeds import kept_in_main, seed_rngs, seeded_by_index

NONE, INDEX, BATCH, SAMPLE = "none", "per sample, batched read", "per batch", "per sample"
WORKER = "per worker"  # an iterable dataset without its own seeding (iterable_seeding)


class WorkerSeeder:
    """``worker_init_fn`` for DataLoader; picklable so it works with spawn."""

    def __init__(self, rank: int = 0) -> None:
        self.rank = rank

    def __call__(self, worker_id: int) -> None:
        entropy = [torch.initial_seed() % 2**63, self.rank, worker_id]
        py_seed, np_seed, torch_seed = np.random.SeedSequence(entropy).generate_state(3, np.uint64)
        random.seed(int(py_seed))
        np.random.seed(int(np_seed) % 2**32)
        torch.manual_seed(int(torch_seed) % 2**63)


def choose_seeding(dataset: Any) -> Tuple[str, str]:
    """(mode, reason) for a map-style ``dataset`` (see the module's docstring)."""
    if getattr(dataset, "deterministic", False):
        return NONE, "the dataset draws no random numbers (deterministic = True)"
    if getattr(dataset, "rng_per_sample", False):
        return INDEX, "random crops from each record's generator, seeded from (seed, epoch, index); one read per batch"
    if callable(getattr(dataset, "__getitems__", None)) and not isinstance(dataset, ImageRecords):
        return BATCH, "one __getitems__ call per batch, RNGs seeded from (seed, epoch, the batch's indices)"
    return SAMPLE, "RNGs seeded from (seed, epoch, index) for each sample (deterministic = True skips it)"


def iterable_seeding(dataset: Any, workers: int) -> Tuple[str, str]:
    """(mode, reason) for an iterable ``dataset``, which draws its own numbers: pixfeed's WebDataset reader
    seeds each sample's draws itself (``seed`` and ``sample_rngs``); any other gets ``WorkerSeeder``."""
    if getattr(dataset, "deterministic", False):
        return NONE, "the dataset draws no random numbers (no random crop, no transform)"
    if hasattr(dataset, "seed") and getattr(dataset, "rng_per_sample", None) is not None:
        return SAMPLE, ("by the dataset: each sample's random crop or transform draws from RNGs seeded from (seed, "
                        "epoch, record index), whichever worker reads it")
    if workers:
        return WORKER, ("each worker's Python, NumPy and torch RNGs seeded from (seed, rank, worker) when the "
                        "workers start (WorkerSeeder)")
    return NONE, "not seeded: the dataset draws from this process's RNGs as they are (num_workers=0)"


class SeededSamples(Dataset):
    """Reads ``source`` (a dataset or a ``BatchReader``) with seeds as ``mode`` says."""

    epoch_in_shared_memory = True

    def __init__(self, source: Any, seed: int, mode: str) -> None:
        self.source, self.seed, self.mode = source, seed, mode
        self.dataset = source.dataset if isinstance(source, BatchReader) else source
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        with kept_in_main():
            return self._seeded(index)

    def __getitems__(self, indices: List[int]) -> Any:
        epoch = int(self._epoch[0])
        if self.mode == INDEX:
            with seeded_by_index(self.seed, epoch):
                return self._batch(indices)
        with kept_in_main():  # saving NumPy's RNG state costs 0.3 ms: once per batch, not per sample
            if self.mode == BATCH:
                seed_rngs(self.seed, epoch, *map(int, indices))
                return self._batch(indices)
            samples = [self._seeded(i) for i in indices]
        return tuple(collate(samples)) if isinstance(self.source, BatchReader) else samples

    def _batch(self, indices: List[int]) -> Any:
        getitems = getattr(self.source, "__getitems__", None)
        return getitems(indices) if callable(getitems) else [self.source[i] for i in indices]

    def _seeded(self, index: int) -> Any:
        seed_rngs(self.seed, int(self._epoch[0]), int(index))
        return self.dataset[index]


def seeded(source: Any, dataset: Any, seed: Optional[int]) -> Tuple[Any, str, str]:
    """(what the DataLoader reads, mode, reason): ``source`` itself or wrapped in ``SeededSamples``."""
    mode, reason = choose_seeding(dataset)
    return (source if mode == NONE else SeededSamples(source, seed or 0, mode)), mode, reason
