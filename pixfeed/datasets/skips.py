"""``make_loader(on_error="skip")``: damaged records skipped at read time, counted and named.

A record is damaged when its stored bytes fail their checksum or cannot be
parsed (``CorruptDataError``) or its image cannot be decoded
(``ImageDecodeError``); anything else (storage that stops answering, a bug in a
``transform``) still raises.  ``SkipLog`` is what the readers share: a count in
shared memory, one slot per process (the training process and each DataLoader
worker, so workers never race on one number), and a warning naming each
damaged record once.  Map-style reads put another record in a
skipped one's place (``pixfeed.loaders.damaged``); pixfeed's WebDataset reader
leaves it out of its stream.

"Once" holds across the loader's processes and epochs: the hash of each named
record is kept in a small shared table (``NAMED`` slots, 8 KiB, nothing per
record of the dataset); two records whose hashes meet in one slot may each be
named again, and two workers meeting one record at the same instant may both
name it.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch.utils.data import get_worker_info

from ..checksum import record_hash
from ..errors import CorruptDataError, ImageDecodeError

DAMAGED = (CorruptDataError, ImageDecodeError)
NAMED = 1024  # slots of the table of named records' hashes
ON_ERROR = ("raise", "skip")


class SkipLog:
    """Damaged records met so far, across the training process and ``workers`` DataLoader workers."""

    def __init__(self, workers: int = 0) -> None:
        self._counts = torch.zeros(workers + 1, dtype=torch.int64).share_memory_()
        self.base = 0  # skipped before a resume (load_state_dict)
        self._named = torch.zeros(NAMED, dtype=torch.int64).share_memory_()  # hashes of records named

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
        if error is None or self._named_before(str(error)):
            return
        warnings.warn(f"pixfeed: on_error='skip': skipped a damaged record ({error}); "
                      f"{instead or 'the epoch is one sample shorter'}", RuntimeWarning, stacklevel=2)

    def _named_before(self, name: str) -> bool:
        """Whether any process of the loader has named the record ``name`` names; marks it named."""
        key = record_hash(name.encode()) >> 1 or 1  # an int64, never 0 (an empty slot)
        slot = key % NAMED
        if int(self._named[slot]) == key:
            return True
        self._named[slot] = key
        return False
