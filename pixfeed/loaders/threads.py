"""Torch's intra-op threads in the training process while workers decode (``plan.training_threads``).

Each torch operation of the training process on a large enough tensor (a
pin-memory copy, a loss on the CPU, the loop's own reductions) runs on
torch's OpenMP team, whose threads then spin for a while, waiting for the
next operation, on CPUs that the DataLoader workers need for decoding.  On 2
CPUs with 2 decoding workers, the training process took 0.25 ms of CPU per
image with torch's 2 threads and 0.10 ms with 1, and the workers read up to
20% more images a second.  torchrun sets ``OMP_NUM_THREADS=1`` for the same
reason, and DataLoader workers run on one thread.

The cap holds while an epoch's batches are read: it is set when the first of
the loader's epochs starts, and the setting found then comes back when the
last epoch being read ends (exhausted, failed, or dropped).
"""
from __future__ import annotations

import threading
from typing import Any, Iterator, Optional

import torch

_lock = threading.RLock()  # re-entrant: a dropped epoch may be collected while this thread holds it
_capped = {"epochs": 0, "before": 1}


class Capped(Iterator[Any]):
    """An epoch's batches, read with torch capped at ``threads`` intra-op threads in this process."""

    def __init__(self, batches: Iterator[Any], threads: int) -> None:
        self.batches, self.open = batches, True
        with _lock:
            if _capped["epochs"] == 0:
                _capped["before"] = torch.get_num_threads()
            _capped["epochs"] += 1
            torch.set_num_threads(min(threads, _capped["before"]))

    def __next__(self) -> Any:
        try:
            return next(self.batches)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.batches)

    def close(self) -> None:
        """End this epoch's cap; the last one open puts back the setting found when the first began."""
        with _lock:
            if self.open:
                self.open = False
                _capped["epochs"] -= 1
                if _capped["epochs"] == 0:
                    torch.set_num_threads(_capped["before"])

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit torch may be gone: nothing left to give back
            pass


def capped(batches: Iterator[Any], threads: Optional[int]) -> Iterator[Any]:
    """``batches`` read with torch capped at ``threads`` threads, or as they are when None."""
    return batches if threads is None else Capped(batches, threads)
