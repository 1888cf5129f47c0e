"""``make_loader(on_error="skip")``: damaged records skipped at read time, counted and named.

A record is damaged when its stored bytes fail their checksum or cannot be
parsed (``CorruptDataError``) or its image cannot be decoded
(``ImageDecodeError``); anything else (storage that stops answering, a bug in a
``transform``) still raises.  ``SkipLog`` is what the readers share: a count in
shared memory, one slot per process (the training process and each DataLoader
worker, so workers never race on one number), and a warning naming each
damaged record once per process.  Map-style reads put another record in a
skipped one's place (``pixfeed.loaders.damaged``); pixfeed's WebDataset reader
leaves it out of its stream.
"""
from __future__ import annotations

import warnings
from typing import Optional, Set

import torch
from torch.utils.data import get_worker_info

from ..errors import CorruptDataError, ImageDecodeError

DAMAGED = (CorruptDataError, ImageDecodeError)
ON_ERROR = ("raise", "skip")


class SkipLog:
    """Damaged records met so far, across the training process and ``workers`` DataLoader workers."""

    def __init__(self, workers: int = 0) -> None:
        self._counts = torch.zeros(workers + 1, dtype=torch.int64).share_memory_()
        self.base = 0  # skipped before a resume (load_state_dict)
        self._warned: Set[str] = set()  # records this process has named already

    @property
    def count(self) -> int:
        return self.base + int(self._counts.sum())

    def record(self, error: Optional[Exception], instead: Optional[str] = None, counted: bool = True) -> None:
        """One damaged record, named by ``error`` (None: counted only); ``instead``: what is read in its
        place; ``counted``: False for a record met only while looking for a replacement (not in the batch)."""
        if counted:
            info = get_worker_info()
            slot = 0 if info is None else min(info.id + 1, len(self._counts) - 1)
            self._counts[slot] += 1
        name = str(error)
        if error is not None and name not in self._warned:
            self._warned.add(name)
            warnings.warn(f"pixfeed: on_error='skip': skipped a damaged record ({name}); "
                          f"{instead or 'the epoch is one sample shorter'}", RuntimeWarning, stacklevel=2)
