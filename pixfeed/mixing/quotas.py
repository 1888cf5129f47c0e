"""What an epoch of a mixture holds: each source's quota, and which of its records fill it.

An epoch is given one of four ways (``quotas``):

* nothing: every sample of every source once (quota = the source's length);
* ``weights`` (relative, any non-negative numbers) with ``epoch_size`` (default: the sources'
  total): the quotas are ``epoch_size`` apportioned by the weights with the largest-remainder
  rule, so they sum to ``epoch_size`` and each is within one sample of its exact share;
* ``counts``: samples of each source per epoch, as given;
* ``repeats``: times each source is seen per epoch (2.5: ``round(2.5 * len)`` samples).

Quotas are exact every epoch: a quota per source, not a coin per sample.

Which records fill a quota (``Stream``): a quota ``q`` of a source of ``n`` records is
``q // n`` whole passes over its records (each record once per pass) and ``r = q % n`` extra
records, all different.  The extras of ``m = n // r`` consecutive epochs are the ``m`` parts of one
permutation of the records, drawn from (seed, source, e // m): so every epoch holds every record
``q // n`` or ``q // n + 1`` times, and over those ``m`` epochs no record is an extra twice and all
but fewer than ``r`` of them are one once (a source at three tenths of its length per epoch: 9 of
its 10 records in 3 epochs, none twice; 2.5 times per epoch: every record twice plus half of them,
the other half the next epoch, then a new cut).  Everything is a function of (seed, epoch); the
sampler shuffles the epoch's samples across sources.  Within a quota, positions follow the records in
file order, pass after pass, and an epoch's extras in file order too: consecutive positions are nearby
records, so ``order="quasi_random"``'s chunks of consecutive indices are runs of one source's file.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence

import numpy as np

from ..errors import MixtureError

PERMUTATIONS_KEPT = 2  # permutations of the extras a stream keeps (one serves n // r epochs)


def _numbers(kind: str, values: Sequence, names: Sequence[str]) -> List[float]:
    """``values`` as finite non-negative numbers, one per source, not all zero; else MixtureError naming it."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise MixtureError(f"{kind}={values!r}: give one number per source (a list of {len(names)})")
    if len(values) != len(names):
        raise MixtureError(f"{kind}={list(values)!r}: {len(values)} numbers for {len(names)} sources; give one "
                           "per source, in the sources' order")
    out = []
    for name, value in zip(names, values):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise MixtureError(f"{kind}: {value!r} for {name} is not a number")
        if not math.isfinite(value) or value < 0:
            raise MixtureError(f"{kind}: {value!r} for {name}; each must be a finite number >= 0 (NaN, "
                               "infinite and negative values mean nothing as a share)")
        if kind == "counts" and value != int(value):
            raise MixtureError(f"counts: {value!r} for {name} is not a whole number of samples")
        out.append(float(value))
    if not any(out):
        raise MixtureError(f"{kind}={list(values)!r}: every one is zero, so an epoch would hold nothing; give at "
                           "least one source a share")
    return out


def apportion(total: int, weights: Sequence[float]) -> List[int]:
    """``total`` split in proportion to ``weights`` (largest remainder; ties to the earlier source)."""
    exact = [total * w / sum(weights) for w in weights]
    shares = [int(math.floor(x)) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in by_remainder[:total - sum(shares)]:
        shares[i] += 1
    return shares


def quotas(lengths: Sequence[int], names: Sequence[str], *, weights=None, epoch_size=None, counts=None,
           repeats=None) -> Dict[str, object]:
    """{"quotas": samples per source per epoch, "kind": how the epoch was given, "given": its numbers}."""
    given = {k: v for k, v in (("weights", weights), ("counts", counts), ("repeats", repeats)) if v is not None}
    if len(given) > 1:
        raise MixtureError(f"{' and '.join(given)}: give one way of saying what an epoch is (weights with "
                           "epoch_size, counts, or repeats), not several")
    if epoch_size is not None and "weights" not in given:
        raise MixtureError("epoch_size goes with weights= (relative shares of an epoch of that many samples); "
                           "counts= and repeats= say the epoch's size themselves")
    if not given:
        return {"quotas": list(lengths), "kind": "once", "given": None}
    kind, values = next(iter(given.items()))
    numbers = _numbers(kind, values, names)
    if kind == "weights":
        size = sum(lengths) if epoch_size is None else epoch_size
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise MixtureError(f"epoch_size={epoch_size!r}: must be a whole number of samples >= 1")
        return {"quotas": apportion(int(size), numbers), "kind": kind, "given": numbers}
    if kind == "counts":
        return {"quotas": [int(v) for v in numbers], "kind": kind, "given": numbers}
    return {"quotas": [int(math.floor(r * n + 0.5)) for r, n in zip(numbers, lengths)], "kind": kind,
            "given": numbers}


class Stream:
    """Source ``source``'s records for any epoch: ``records(seed, epoch, local)`` maps positions in its
    quota ``q`` to (record indices, passes) as the module's docstring says.  A pass numbers the
    epoch's reading of a record (``epoch * (q // n + 1)`` + the whole pass it is in, or + ``q // n``
    for the extras), so that a record read twice draws two different random crops."""

    def __init__(self, length: int, quota: int, source: int) -> None:
        self.n, self.q, self.source = length, quota, source
        self.whole, self.extra = divmod(quota, length)
        self.in_order = self.whole == 1 and not self.extra  # position p of the quota is record p, in one pass
        self._perms: Dict[tuple, np.ndarray] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_perms": {}}

    def permutation(self, seed: int, c: int) -> np.ndarray:
        key = (seed, c)
        if key not in self._perms:
            if len(self._perms) >= PERMUTATIONS_KEPT:
                self._perms.pop(next(iter(self._perms)))
            perm = np.random.default_rng([seed, 0x6D6978, self.source, c]).permutation(self.n)
            if self.extra:  # each epoch's part in record order: its extras are read in file order
                parts = self.n // self.extra * self.extra
                perm[:parts].reshape(-1, self.extra).sort(axis=1)
            self._perms[key] = perm
        return self._perms[key]

    def records(self, seed: int, epoch: int, local: np.ndarray) -> tuple:
        """(records, passes) of quota positions ``local`` (an int64 array, each in ``0..q-1``) in ``epoch``."""
        local = np.asarray(local, dtype=np.int64)
        if self.in_order:  # the quota is the source once (every sample once): no arithmetic
            return local, np.full(len(local), np.int64(epoch) * 2)
        if not self.whole:  # a share of the source: every position is an extra
            cut, part = divmod(int(epoch), self.n // self.extra)
            return self.permutation(seed, cut)[part * self.extra + local], np.full(len(local), np.int64(epoch))
        passes, records = np.divmod(local, self.n)  # whole passes: the records in their order
        extra = np.flatnonzero(passes >= self.whole)
        if extra.size:
            cut, part = divmod(int(epoch), self.n // self.extra)
            records[extra] = self.permutation(seed, cut)[part * self.extra + local[extra] - self.whole * self.n]
        return records, passes + np.int64(epoch) * (self.whole + 1)

    def epoch_records(self, seed: int, epoch: int) -> np.ndarray:
        """Every record of the epoch's quota, in quota order (for tests and tools; ``records`` per batch)."""
        return self.records(seed, epoch, np.arange(self.q, dtype=np.int64))[0]
