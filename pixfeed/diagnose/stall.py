"""``StallMeter``: is the training loop waiting for data?

Wrap the loader and, optionally, the copy to the device::

    with pixfeed.StallMeter() as meter:
        for images, labels in meter.iter(loader):
            images, labels = meter.to_device((images, labels), "cuda")
            train_step(images, labels)
    print(meter.report())

Per batch it records the wait (the time ``next(loader)`` took), the copy
time inside ``to_device`` and the compute time (the rest, until the loop asks
for the next batch).  With CUDA initialised it synchronises at both points,
so compute includes the GPU work queued by the step and the wait is time the
GPU really sat idle.  A ``DevicePrefetcher`` inside the loop counts as wait.
Where batches are decoded on the GPU, each step also records the GPU decoder's
seconds and images counted from the start of its wait to its end
(``stages.gpu_stats``), whether that decode held the loop or overlapped the step.
"""
from __future__ import annotations

import time
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, List, Optional

import torch

from pixfeed.diagnose.advice import InUse
from pixfeed.diagnose.report import StallReport, Step
from pixfeed.diagnose.stages import gpu_delta, gpu_stats, sample_stages
from pixfeed.errors import require_int
from pixfeed.loaders.collate import batch_images


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _move(batch: Any, device: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_move(item, device) for item in batch)
    return batch


class StallMeter:
    """Times wait, transfer and compute per batch; ``report()`` gives the verdict.

    The first ``warmup`` batches (worker start-up) are left out of the report.
    """

    def __init__(self, warmup: int = 0) -> None:
        self.warmup = warmup
        self.steps: List[Step] = []
        self.loader: Any = None
        self._open: Optional[Step] = None
        self._began = 0.0
        self._gpu: dict = {}

    def __enter__(self) -> "StallMeter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close()

    def iter(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Yield ``loader``'s batches, timing how long each one kept the loop waiting."""
        self.loader = loader if self.loader is None else self.loader
        batches = iter(loader)
        while True:
            self._close()
            self._gpu, start = gpu_stats(), time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            self._began = time.perf_counter()
            self._open = Step(wait=self._began - start, images=batch_images(batch))
            yield batch

    def to_device(self, batch: Any, device: Any) -> Any:
        """Move the tensors of ``batch`` to ``device``, timing the copy."""
        start = time.perf_counter()
        moved = _move(batch, device)
        _sync()
        if self._open is not None:
            self._open.transfer += time.perf_counter() - start
        return moved

    def _close(self) -> None:
        if self._open is None:
            return
        _sync()
        step, self._open = self._open, None
        step.compute = time.perf_counter() - self._began - step.transfer
        if self._gpu:
            moved = gpu_delta(self._gpu, gpu_stats())
            step.gpu_decode, step.gpu_decoded, step.cpu_fallback = (
                moved["gpu_seconds"], int(moved["gpu_decoded"]), int(moved["cpu_fallback"]))
        self.steps.append(step)

    def report(self, stages: Optional[dict] = None, epochs: Optional[int] = None) -> StallReport:
        """The verdict over the batches after warm-up; ``stages`` from ``stages.sample_stages``; the
        advice knows what the first loader given to ``iter`` already uses."""
        return StallReport(self.steps[self.warmup:], stages or {}, InUse.of(self.loader), epochs)


class Epochs:
    """``count`` batches of ``loader``, starting new epochs as needed (a small dataset gives one
    batch an epoch); fewer only when an epoch gives none.  ``epochs`` counts the epochs begun."""

    def __init__(self, loader: Iterable[Any], count: int) -> None:
        self.loader, self.count, self.epochs = loader, count, 0

    def __iter__(self) -> Iterator[Any]:
        left = self.count
        while left > 0:
            self.epochs += 1
            before = left
            for batch in islice(self.loader, left):
                left -= 1
                yield batch
            if left == before:
                return


def profile_loader(loader: Iterable[Any], steps: int = 50, step_fn: Optional[Callable[[Any], Any]] = None, *,
                   device: Any = "auto", warmup: int = 1, stage_batches: int = 2) -> StallReport:
    """Run ``warmup + steps`` batches of ``loader`` through ``step_fn`` and report the stalls, over as
    many epochs as that takes (an empty loader: a report that says nothing was measured).

    ``device="auto"`` copies batches to CUDA when it is available (None: no copy);
    ``stage_batches`` batches are then read in this process to split the wait by stage.
    """
    require_int("steps", steps, 1)
    require_int("warmup", warmup, 0)
    require_int("stage_batches", stage_batches, 0)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else None
    batches = Epochs(loader, warmup + steps)
    with StallMeter(warmup=warmup) as meter:
        meter.loader = loader
        for batch in meter.iter(batches):
            if device is not None:
                batch = meter.to_device(batch, device)
            if step_fn is not None:
                step_fn(batch)
    return meter.report(sample_stages(loader, stage_batches), batches.epochs)
