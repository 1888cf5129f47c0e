"""Random seeds: per sample for map-style datasets, per worker for everything else.

Map-style datasets (``SeededSamples``): ``make_loader`` reads every sample of a
dataset that may draw random numbers inside ``pixfeed.seeds.sample_rngs(seed,
epoch, index)``, so a random crop or transform depends on the loader's
``seed``, the epoch and the sample's index only: not on which worker read it,
how many workers there are, the prefetch depth, or a resume that skipped the
samples before it.  Each sample differs from every other, each epoch from the
last, the same seed repeats.  A user's dataset with its own ``__getitems__``
(one call per batch: a database query, one ranged GET) keeps it: the RNGs are
seeded once per batch from ``(seed, epoch, the batch's indices)``, so a resume
is exact for the same batch size and world (pixfeed's own readers stay per
sample, so their crops do not depend on the batch).  A dataset declares that it draws nothing with
``deterministic = True`` (pixfeed's datasets do without ``crop="random"`` or a
``transform``); its batches are then read with its own ``get_batch`` or
``__getitems__`` as before.  The epoch lives in shared memory, so persistent
workers see ``set_epoch``.  Without workers the reading happens in the training
process, whose RNG states are saved and restored around each batch; the
process-wide RNGs are shared by its threads, so with ``read_ahead=True`` (a
reader thread running beside the training loop) crops stay per-sample only if
the training loop draws nothing from them meanwhile.

Workers (``WorkerSeeder``): the DataLoader draws a base seed from its generator
(seeded with ``seed``) each time worker processes start; worker ``w`` sees
``torch.initial_seed() == base + w``.  ``WorkerSeeder`` mixes that with the
rank through NumPy's ``SeedSequence`` and seeds Python's ``random``, NumPy's
global RNG and torch's, so draws outside a sample's reading (an iterable
dataset's own) differ per worker, rank and epoch and repeat for the same seed.
"""
from __future__ import annotations

import random
from typing import Any, List

import numpy as np
import torch
from torch.utils.data import Dataset

from pixfeed.datasets.base import ImageRecords
from pixfeed.loaders.batch import BatchReader
from pixfeed.loaders.collate import collate
from pixfeed.seeds import kept_in_main, seed_rngs


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


class SeededSamples(Dataset):
    """Reads each sample of ``source`` (a dataset or a ``BatchReader``) with RNGs seeded per sample."""

    epoch_in_shared_memory = True

    def __init__(self, source: Any, seed: int) -> None:
        self.source, self.seed = source, seed
        self.dataset = source.dataset if isinstance(source, BatchReader) else source
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.batched = not isinstance(source, BatchReader) and reads_batches(source)

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        with kept_in_main():
            return self._seeded(index)

    def __getitems__(self, indices: List[int]) -> Any:
        if self.batched:  # the dataset's own batch read (a query, a ranged GET): one call, seeded per batch
            with kept_in_main():
                seed_rngs(self.seed, int(self._epoch[0]), *(int(i) for i in indices))
                return self.dataset.__getitems__(indices)
        with kept_in_main():  # saving NumPy's RNG state costs 0.3 ms: once per batch, not per sample
            samples = [self._seeded(i) for i in indices]
        return tuple(collate(samples)) if isinstance(self.source, BatchReader) else samples

    def _seeded(self, index: int) -> Any:
        seed_rngs(self.seed, int(self._epoch[0]), int(index))
        return self.dataset[index]


def draws_randomness(dataset: Any) -> bool:
    return not getattr(dataset, "deterministic", False)


def reads_batches(dataset: Any) -> bool:
    """A user's dataset with its own ``__getitems__`` (pixfeed's readers are seeded per sample, so that their
    crops do not depend on the batch size)."""
    return callable(getattr(dataset, "__getitems__", None)) and not isinstance(dataset, ImageRecords)
