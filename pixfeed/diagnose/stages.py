"""Where a loader's time goes: read, decode, transform, collate, measured in this process.

The training loop only sees how long it waited for a batch, not why.  To
split that wait, ``sample_stages`` reads a few of the loader's own batches (the
same indices, dataset and collate function) in the calling process, with a
timer around each stage hook of the dataset:

* read: ``read_stored`` and ``check_checksum`` (fetching stored bytes, checksum included),
* decode: ``pixels`` (decode, crop and resize to the requested size),
* transform: the dataset's ``transform``,
* collate: the loader's ``collate_fn``; on the batch path (``get_batch``) the
  stacking into one array, i.e. the batch call's time outside the hooks above,
* other: the rest of the per-sample calls (the whole ``__getitem__`` for a
  dataset without pixfeed's hooks).

Decoding on the GPU (``make_loader(..., device="cuda")``) happens where the batches are
consumed, not in these hooks: ``gpu_stats`` reads ``pixfeed.image.gpu.stats()`` (images decoded on
the GPU, CPU fallbacks, seconds of GPU decode in this process) and the stall meter takes its deltas
per batch, so the report shows GPU decode as its own stage, ``GPU_STAGE``.  The module is read only
when something already imported it: a loop that never decodes on the GPU costs nothing and shows nothing.

An iterable dataset (WebDataset) is read the same way, its next samples in
this process, with its shuffle buffer off on the copy.  Workers run the same code, so the shares carry over to them, while absolute
times differ (workers run in parallel and compete for CPUs): the profiler
splits the measured wait by these shares.  The hooks are wrapped on a shallow
copy of the dataset, and the process's RNGs are restored afterwards.
"""
from __future__ import annotations

import copy
import sys
import time
from itertools import islice
from functools import partial
from typing import Any, Callable, Dict, Iterator

from torch.utils.data import DataLoader, IterableDataset

from pixfeed.loaders.batch import BatchReader
from pixfeed.loaders.seeding import SeededSamples
from pixfeed.seeds import preserved_rngs

STAGES = ("read", "decode", "transform", "collate", "other")
HOOKS = {"read_stored": "read", "check_checksum": "read", "pixels": "decode", "transform": "transform"}
GPU_STAGE = "gpu decode"
GPU_COUNTS = ("gpu_decoded", "cpu_fallback", "gpu_seconds")


def gpu_stats() -> Dict[str, float]:
    """``pixfeed.image.gpu.stats()`` when that module is imported (by a loader that decodes on the GPU), else {}."""
    gpu = sys.modules.get("pixfeed.image.gpu")
    return dict(gpu.stats()) if gpu is not None else {}


def gpu_delta(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    """What the GPU decoder counted between two ``gpu_stats()``: images, fallbacks, seconds."""
    return {name: after.get(name, 0) - before.get(name, 0) for name in GPU_COUNTS}


def _timed(fn: Callable[..., Any], stage: str, seconds: Dict[str, float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[stage] += time.perf_counter() - start
    return timed


def instrumented(dataset: Any, seconds: Dict[str, float]) -> Any:
    """A shallow copy of ``dataset`` whose stage hooks add their time to ``seconds``."""
    probe = copy.copy(dataset)
    for name, stage in HOOKS.items():
        hook = getattr(probe, name, None)
        if callable(hook):
            setattr(probe, name, _timed(hook, stage, seconds))
    return probe


def _fetch(dataset: Any, indices: list, batched: bool) -> Any:
    if batched:
        return dataset.get_batch(indices)
    if callable(getattr(dataset, "__getitems__", None)):
        return dataset.__getitems__(indices)
    return [dataset[i] for i in indices]


def _fetches(loader: DataLoader, probe: Any, batched: bool, batches: int) -> Iterator[Callable[[], Any]]:
    """One call per sampled batch that reads it from ``probe``: by the loader's batch sampler, or for an
    iterable dataset the next ``batch_size`` samples."""
    if isinstance(probe, IterableDataset):
        samples = iter(probe)
        return (lambda: list(islice(samples, loader.batch_size or 1)) for _ in range(batches))
    return (partial(_fetch, probe, list(indices), batched)
            for indices in islice(iter(loader.batch_sampler), batches))


def sample_stages(loader: Any, batches: int = 2) -> Dict[str, float]:
    """Seconds per batch in each of STAGES, from ``batches`` of the loader's batches read here;
    {} unless ``loader`` is a DataLoader."""
    if not isinstance(loader, DataLoader) or batches < 1:
        return {}
    source = loader.dataset.source if isinstance(loader.dataset, SeededSamples) else loader.dataset
    batched = isinstance(source, BatchReader)
    seconds = dict.fromkeys(STAGES, 0.0)
    probe = instrumented(source.dataset if batched else source, seconds)
    if getattr(probe, "buffer", 0):  # a shuffle buffer reads far ahead of the samples timed here
        probe.buffer = 0
    count = 0
    with preserved_rngs():
        for fetch in _fetches(loader, probe, batched, batches):
            hooked, start = sum(seconds.values()), time.perf_counter()
            samples = fetch()
            if not len(samples):
                break
            middle = time.perf_counter()
            loader.collate_fn(samples)
            seconds["collate" if batched else "other"] += middle - start - (sum(seconds.values()) - hooked)
            seconds["collate"] += time.perf_counter() - middle
            count += 1
    return {stage: s / count for stage, s in seconds.items()} if count else {}
