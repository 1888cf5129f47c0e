"""Random draws that depend on (seed, epoch, sample index) alone.

``sample_rngs(seed, epoch, index)`` seeds Python's ``random``, NumPy's global
RNG and torch's CPU RNG from ``numpy.random.SeedSequence([seed, epoch,
index])`` for the block it wraps.  Reading a sample inside it makes every
random augmentation drawn from those RNGs (pixfeed's random crop, which draws
from torch's, and any ``transform``) a function of the sample and the epoch:
the same in any DataLoader worker, with any number of workers, and again after
a resume that skips the samples before it.  In the training process (no
DataLoader worker) the caller's RNG states are restored afterwards, so reading
a sample never moves them.

``seeded_by_index(seed, epoch)`` does the same without touching any global
RNG, for readers that draw every number through ``index_rng(index)`` (pixfeed's
random crops): inside it, in the thread that entered it, ``index_rng`` is a
NumPy generator seeded from ``(seed, epoch, index)``; outside it, None.  A
batch can then be read in one call and still get per-sample draws, and the
draws can be made before the samples are handed to other threads.

``seed_rngs(seed, epoch, *indices)`` with a batch's indices seeds the global
RNGs once for a whole batch (datasets read a batch at a time by their own
``__getitems__`` or ``get_batch``).
"""
from __future__ import annotations

import random
import threading
from contextlib import contextmanager, nullcontext
from typing import Iterator, Optional

import numpy as np
import torch
from torch.utils.data import get_worker_info


_by_index = threading.local()


def seed_rngs(seed: int, epoch: int, *indices: int) -> None:
    """Seed Python's, NumPy's global and torch's CPU RNG from ``(seed, epoch, index)`` (a sample), or from
    ``(seed, epoch, *indices)`` (a batch read in one call)."""
    py_seed, np_seed, torch_seed = np.random.SeedSequence([seed, epoch, *indices]).generate_state(3, np.uint64)
    random.seed(int(py_seed))
    np.random.seed(int(np_seed) % 2**32)
    torch.default_generator.manual_seed(int(torch_seed) % 2**63)  # torch.manual_seed also seeds devices: 100x slower


@contextmanager
def sample_rngs(seed: int, epoch: int, index: int) -> Iterator[None]:
    """Seed the global RNGs from ``(seed, epoch, index)`` for one sample's reading."""
    with kept_in_main():
        seed_rngs(seed, epoch, index)
        yield


def kept_in_main():
    """``preserved_rngs()`` in the training process, nothing in a DataLoader worker (whose RNGs are its own)."""
    return preserved_rngs() if get_worker_info() is None else nullcontext()


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


@contextmanager
def seeded_by_index(seed: int, epoch: int) -> Iterator[None]:
    """Make ``index_rng`` give per-sample generators in this thread for the block."""
    outer = getattr(_by_index, "key", None)
    _by_index.key = (seed, epoch)
    try:
        yield
    finally:
        _by_index.key = outer


def index_rng(index: int) -> Optional[np.random.Generator]:
    """Sample ``index``'s generator, from ``(seed, epoch, index)``, inside ``seeded_by_index``; else None."""
    key = getattr(_by_index, "key", None)
    return None if key is None else np.random.default_rng([*key, index])
