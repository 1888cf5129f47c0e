"""Progress of a reader while the loader waits on it, and the names of a batch's records.

``Stall`` tells a slow reader from a stuck one by ``proc.py``'s counters (CPU
time, page faults, bytes read): any change restarts the clock, and only
``stall_timeout`` seconds without one is a stall.  ``RecordedSampler`` keeps
the epoch's order so that an error can name the records of the batch it was
waiting for (``batch_records``).
"""
from __future__ import annotations

import time
from typing import Any, Iterator, Optional

import numpy as np
from torch.utils.data import DistributedSampler

from pixfeed.errors import LoaderStalledError
from pixfeed.loaders.proc import Task
from pixfeed.loaders.sampler import ResumableSampler

POLL = 1.0  # seconds between checks while the loader waits on a reader


class RecordedSampler(ResumableSampler):
    """pixfeed's sampler, keeping the epoch's order so that a stalled batch's records can be named."""

    order: Optional[np.ndarray] = None

    def __iter__(self) -> Iterator[int]:
        self.order = self.indices()
        return self.follow(self.order)


class SplitSampler(RecordedSampler, DistributedSampler):
    """The sampler of a loader that splits by rank itself (``distributed`` "auto" or True): a
    ``DistributedSampler``, so that frameworks keep it instead of injecting their own."""


def batch_records(loader: Any, batch: int) -> str:
    """The records of the epoch's ``batch``-th batch, as the error messages name them."""
    order = getattr(loader.sampler, "order", None)
    if order is None or not len(order):
        return f"batch {batch} of the stream"
    records = order[batch * loader.batch_size:(batch + 1) * loader.batch_size].tolist()
    dataset = getattr(loader.dataset, "dataset", loader.dataset)
    first = dataset.where(records[0]) if callable(getattr(dataset, "where", None)) else f"record {records[0]}"
    more = f" and {len(records) - 4} more" if len(records) > 4 else ""
    return f"batch {batch}: records {records[:4]}{more}, the first being {first}"


class Stall:
    """Whether one reader has gone ``timeout`` seconds without progress while the loader waited."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.reset()

    def reset(self) -> None:
        self.last: Any = None
        self.since = time.monotonic()

    def stuck(self, reader: Any, snapshot: Task) -> bool:
        if (reader, snapshot.progress) != self.last:
            self.last, self.since = (reader, snapshot.progress), time.monotonic()
        return time.monotonic() - self.since > self.timeout

    def error(self, who: str, records: str, snapshot: Task) -> LoaderStalledError:
        if snapshot.state in ("T", "t"):
            cause = "it is stopped (SIGSTOP or a debugger; SIGCONT resumes it)"
        elif snapshot.file:
            cause = f"its read of {snapshot.file} does not return: the storage stopped answering (a network or FUSE mount?)"
        else:
            cause = "it is blocked (a read that never returns, a lock, a full pipe)"
        return LoaderStalledError(f"{who} made no progress for {self.timeout:g} s reading {records} ({snapshot}): "
                                  f"{cause}. A reader that still reads or computes is not stopped; if one record "
                                  "may take longer, raise make_loader's stall_timeout")
