"""Autotune: measure a few loader settings on real batches and keep the fastest
(``pixfeed.autotune``, and ``make_loader(num_workers="tune")``).

``autotune(dataset, batch_size)`` measures, within ``budget_s`` seconds:

1. worker counts at torch's default prefetch depth (2): in process (0), and
   half, all but one, all, and twice the usable CPUs (twice helps when reads
   wait on storage rather than on CPUs);
2. the fastest count again with 4 batches ready per worker.

Each candidate gets an equal share of the budget.  A loader is built with
``make_loader`` (the other options as given), its first ``max(1, workers)``
batches are discarded (worker start-up: the first batches all arrive at
once), then batches are counted until the share is spent (at least
``MIN_BATCHES``), starting new epochs if needed.  This measures the loader
alone; with a training step competing for the CPUs the ranking can shift
(``profile_loader`` shows whether the loop still waits).  The process's RNGs
are left as they were.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from pixfeed.machine.cpus import available_cpus
from pixfeed.errors import OptionError, require_int
from pixfeed.loaders.collate import batch_images
from pixfeed.loaders.loader import PixfeedLoader, build_loader
from pixfeed.seeds import preserved_rngs
from pixfeed.console.texttable import table

BUDGET_S = 15.0
MIN_BATCHES = 2
Setting = Tuple[int, Optional[int]]


@dataclass(frozen=True)
class Candidate:
    num_workers: int
    prefetch_factor: Optional[int]
    images_per_s: float
    batches: int


@dataclass
class TuneResult:
    candidates: List[Candidate]

    @property
    def best(self) -> Candidate:
        return max(self.candidates, key=lambda c: c.images_per_s)

    def to_dict(self) -> dict:
        return {"best": asdict(self.best), "candidates": [asdict(c) for c in self.candidates]}

    def __str__(self) -> str:
        rows = [["*" if c == self.best else "", c.num_workers, c.prefetch_factor or "-", f"{c.images_per_s:.0f}",
                 c.batches] for c in self.candidates]
        return "\n".join(table(("", "num_workers", "prefetch", "images/s", "batches"), rows))


def worker_counts(cpus: int) -> List[int]:
    return sorted({max(1, cpus // 2), max(1, cpus - 1), cpus, 2 * cpus})


def epochs(loader: Any) -> Iterator[Any]:
    """The loader's batches, epoch after epoch; it ends when an epoch gives none."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return


def _epochs(loader: PixfeedLoader) -> Iterator[Any]:
    yield from epochs(loader)
    raise OptionError("autotune: the loader yields no batches; use a smaller batch_size or drop_last=False")


def _for_workers(options: dict, workers: int) -> dict:
    """``options`` for a candidate: persistent_workers=True means nothing without workers."""
    if workers == 0 and options.get("persistent_workers") is True:
        return {**options, "persistent_workers": "auto"}
    return options


def measure(dataset: Any, batch_size: int, setting: Setting, seconds: float, **options: Any) -> Candidate:
    """Images/s of one (num_workers, prefetch_factor) setting over about ``seconds``."""
    workers, prefetch = setting
    options = _for_workers(options, workers)
    deadline = time.perf_counter() + seconds
    with warnings.catch_warnings():  # more workers than CPUs is a deliberate candidate
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        loader = build_loader(dataset, batch_size, num_workers=workers, prefetch_factor=prefetch or "auto", **options)
        batches = _epochs(loader)
        for _ in range(max(1, workers)):
            next(batches)
        start, images, count = time.perf_counter(), 0, 0
        while count < MIN_BATCHES or time.perf_counter() < deadline:
            images += batch_images(next(batches))
            count += 1
    rate = images / (time.perf_counter() - start)
    batches.close()
    return Candidate(workers, loader.pixfeed_plan.prefetch_factor, rate, count)


def autotune(dataset: Any, batch_size: int, *, candidates: Optional[Sequence[Setting]] = None,
             budget_s: Optional[float] = None, **options: Any) -> TuneResult:
    """Measure candidate (num_workers, prefetch_factor) settings within ``budget_s`` (default
    ``BUDGET_S``) seconds; ``options`` go to ``make_loader``."""
    require_int("batch_size", batch_size, 1)
    budget_s = BUDGET_S if budget_s is None else budget_s
    if not budget_s > 0:
        raise OptionError(f"budget_s must be a positive number of seconds, not {budget_s!r}")
    settings = list(candidates) if candidates else [(0, None)] + [(w, 2) for w in worker_counts(available_cpus())]
    share = budget_s / (len(settings) + (candidates is None))
    with preserved_rngs():
        results = [measure(dataset, batch_size, s, share, **options) for s in settings]
        best = max(results, key=lambda c: c.images_per_s)
        if candidates is None and best.num_workers:
            results.append(measure(dataset, batch_size, (best.num_workers, 4), share, **options))
    return TuneResult(results)


def tuned_loader(dataset: Any, batch_size: int, prefetch_factor: Any = "auto", **options: Any) -> PixfeedLoader:
    """``make_loader(num_workers="tune")``: the fastest measured setting; the table is ``loader.pixfeed_tuning``.

    A prefetch_factor other than "auto" is kept, and only the worker count is tuned."""
    candidates = None if prefetch_factor == "auto" else \
        [(0, None)] + [(w, prefetch_factor) for w in worker_counts(available_cpus())]
    tuning = autotune(dataset, batch_size, candidates=candidates, **options)
    best = tuning.best
    loader = build_loader(dataset, batch_size, num_workers=best.num_workers,
                         prefetch_factor=best.prefetch_factor or "auto", **_for_workers(options, best.num_workers))
    loader.pixfeed_tuning = tuning
    loader.pixfeed_plan.reasons["num_workers"] = (f"autotuned: fastest of {len(tuning.candidates)} measured "
                                                  f"settings, {best.images_per_s:.0f} images/s")
    return loader
