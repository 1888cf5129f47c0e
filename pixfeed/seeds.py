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
RNG, for readers that draw every number through ``crop_draws(indices)``
(pixfeed's random crops): inside it, in the thread that entered it, a batch's
draws are ``uniforms(seed, epoch, indices)``; outside it, the key is a number
drawn from torch's RNG (so DataLoader worker seeding governs it).  A batch is
then read in one call and still gets per-sample draws, made before the samples
are handed to other threads.

``uniforms(seed, epoch, indices)`` is counter-based: each record's ``DRAWS``
numbers are SplitMix64 outputs from a state hashed from (seed, epoch, index),
computed for a whole batch in a few vectorised NumPy operations (about 0.1 µs a
sample), never from a generator made per sample.  A record's crop is therefore
the same in every format (mmap, LMDB, HDF5, WebDataset), on every device, with
any number of workers, and after a resume.  ``Draws(row)`` hands one record's
numbers out in order through ``np.random.Generator``'s ``random``, ``uniform``
and ``integers``, so ``geometry.random_box`` takes either.

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


DRAWS = 23  # numbers a random-resized crop and flip take at most: ten tries of two, then top, left, flip
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_STEPS = np.arange(1, DRAWS + 1, dtype=np.uint64) * _GOLDEN


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def uniforms(seed: int, epoch: int, indices, count: int = DRAWS) -> np.ndarray:
    """len(indices) x ``count`` float64 numbers in [0, 1): row k is a function of (seed, epoch, indices[k])
    alone (SplitMix64's stream from a state hashed from the three)."""
    if not 0 < count <= DRAWS:
        raise ValueError(f"count {count}: at most {DRAWS} numbers a record")
    idx = np.asarray(indices, dtype=np.int64).reshape(-1).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _mix(_mix(np.array([int(seed) % 2**64], np.uint64) + _GOLDEN) ^ np.uint64(int(epoch) % 2**64))
        state = _mix(key ^ _mix(idx + _GOLDEN))
        bits = _mix(state[:, None] + _STEPS[None, :count])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def crop_draws(indices) -> np.ndarray:
    """The N x DRAWS numbers of these records' random crops: from (seed, epoch, index) inside
    ``seeded_by_index``; else keyed by one number drawn from torch's RNG for the call."""
    key = getattr(_by_index, "key", None)
    if key is None:
        key = (int(torch.randint(0, 2**62, ()).item()), 0)
    return uniforms(key[0], key[1], indices)


class Draws:
    """One record's row of ``uniforms`` handed out in order, as ``np.random.Generator`` would draw them:
    ``random()``, ``uniform(low, high)`` and ``integers(low, high)`` (what ``geometry.plan`` calls)."""
    __slots__ = ("row", "used")

    def __init__(self, row) -> None:
        self.row, self.used = list(row), 0

    def random(self) -> float:
        if self.used >= len(self.row):
            raise IndexError(f"a record's {len(self.row)} random numbers are all used (they serve one "
                             "random-resized crop and flip)")
        self.used += 1
        return self.row[self.used - 1]

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        return low + (high - low) * self.random()

    def integers(self, low: int, high: Optional[int] = None) -> int:
        if high is None:
            low, high = 0, low
        return low + int(self.random() * (high - low))


def batch_draws(indices) -> list:
    """``Draws`` of each of ``indices`` (``crop_draws``, one vectorised step for the batch)."""
    return [Draws(row) for row in crop_draws(indices).tolist()]
