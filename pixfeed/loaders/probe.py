"""How many bytes one sample takes, learnt without reading a sample in this process.

``make_loader`` needs the size of a batch to fit the batches in flight into
``/dev/shm`` (``shm.py``) and to size ``prefetch_factor`` (``plan.py``):

1. from the dataset's metadata when it declares ``fixed_shape`` (every pixfeed
   dataset opened with ``size=`` or storing pixels): uint8 pixels plus an
   int64 label;
2. else, only when there will be worker processes, by reading sample 0 in a
   throwaway process of the kind the workers will be (torch's default
   multiprocessing context), which reports the byte count and exits.

``read_seconds`` measures what reading a sample costs in process the same
way (for the worker plan, ``plan.choose_workers``): a throwaway process
iterates the dataset (an iterable one, its own shuffle buffer off: the cost
of a sample, not of filling the buffer) and times ``READ_SAMPLES`` samples
after the first (which opens files), within ``READ_BUDGET_S``, and their
collation into a batch.

Reading sample 0 in the training process itself would open the handles of a
dataset that opens LMDB environments, HDF5 files or sockets lazily, before the
workers fork, and every worker would then share them: the bug lazy opening
exists to avoid.  If the throwaway process fails or takes longer than
``PROBE_TIMEOUT_S``, the size is unknown and the plan says so (the loader
then surfaces the dataset's own error, from a worker).
"""
from __future__ import annotations

import math
import time
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import IterableDataset

from pixfeed.loaders.collate import collate

PROBE_TIMEOUT_S = 60
READ_SAMPLES = 32   # samples timed by read_seconds, after the first
READ_BUDGET_S = 0.5  # or fewer, when they take longer


def sample_bytes(dataset: Any, workers: int) -> Optional[int]:
    """Bytes of one sample: from ``fixed_shape`` (uint8) when known, else probed if there are workers."""
    shape = getattr(dataset, "fixed_shape", None)
    if shape is not None:
        return math.prod(shape) + 8
    if not workers or isinstance(dataset, IterableDataset) or len(dataset) == 0:
        return None
    return _probe(dataset)


def read_seconds(dataset: Any) -> Optional[float]:
    """Seconds one sample of the iterable ``dataset`` takes to read in process (measured in a throwaway
    process), or None when it cannot be told (it failed, timed out, or has fewer than two samples)."""
    return _probe(dataset, _time_reads)


def _time_reads(dataset: Any, send: Any) -> None:
    seconds: Optional[float] = None
    try:
        if hasattr(dataset, "shuffle"):
            dataset.shuffle = False  # this process's copy: a sample's cost, not a full shuffle buffer's
        samples, read = iter(dataset), []
        next(samples)
        start = time.perf_counter()
        for sample in samples:
            read.append(sample)
            if len(read) == READ_SAMPLES or time.perf_counter() - start > READ_BUDGET_S:
                break
        if read:
            collate(read)  # as the loader collates them in process
            seconds = (time.perf_counter() - start) / len(read)
    except Exception:  # the loader's workers will raise it where the training loop sees it
        seconds = None
    send.send(seconds)


def _probe(dataset: Any, target: Any = None) -> Any:
    context = torch.multiprocessing.get_context()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=target or _report, args=(dataset, send), name="pixfeed-sample-probe",
                              daemon=True)
    process.start()
    send.close()
    try:
        return receive.recv() if receive.poll(PROBE_TIMEOUT_S) else None
    except EOFError:  # the process died before it could report
        return None
    finally:
        receive.close()
        if process.is_alive():
            process.kill()
        process.join()


def _report(dataset: Any, send: Any) -> None:
    try:
        size: Optional[int] = _nbytes(dataset[0])
    except Exception:  # the loader's workers will raise it where the training loop sees it
        size = None
    send.send(size)


def _nbytes(value: Any) -> int:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(item) for item in value)
    if isinstance(value, dict):
        return sum(_nbytes(item) for item in value.values())
    return 8
