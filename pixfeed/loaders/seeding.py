"""Per-worker random seeds, so augmentations never repeat across workers, ranks or epochs.

The DataLoader draws a base seed from its generator (seeded with ``seed``) each
time worker processes start; worker ``w`` sees ``torch.initial_seed() ==
base + w``.  ``WorkerSeeder`` mixes that with the rank through NumPy's
``SeedSequence`` and seeds Python's ``random``, NumPy's global RNG and torch's:

* workers differ because ``w`` differs, ranks differ because the rank is mixed in;
* epochs differ: without persistent workers a new base seed is drawn per epoch,
  with persistent workers each worker's RNG streams simply continue;
* the same ``seed`` gives the same base seeds, hence the same augmentations.

With no workers, reading happens in the training process and draws from its
RNGs: seed those yourself (``torch.manual_seed``).
"""
from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch


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


@contextmanager
def preserved_rngs() -> Iterator[None]:
    """Run a block (like probing sample 0) without moving the process's global RNGs."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
