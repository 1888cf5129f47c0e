"""Epoch orders for the sampler: a full shuffle, or quasi-random for datasets larger than memory.

``quasi_random(n, chunk, window, generator)`` cuts the records into chunks of
``chunk`` consecutive records, shuffles the chunks, then shuffles the records
within each run of ``window`` positions of that sequence.  Every record comes
exactly once; an epoch's records are read a window at a time, so the pages
needed next are a few runs of consecutive records (long sequential reads for
the read-ahead, ``readahead.py``) instead of single records all over the file.
A window holds many chunks from all over the dataset, so a batch still mixes
records from far apart (classes, when the dataset is packed class by class):
the sizes come from the read-ahead budget (``plan.choose_order``).

Like the full shuffle, the order is drawn from a ``torch.Generator`` seeded
with ``seed + epoch``, the same on every rank; ``ResumableSampler`` deals it
out to ranks and resumes part-way through it.

Orders are NumPy arrays (8 bytes a record, no Python object per record: a
list of 10M ints took ~360 MB in every process that built one); ``as_ints``
hands them out as Python ints a block at a time.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

ORDERS = ("auto", "random", "quasi_random")  # auto: quasi_random for a bucket dataset larger than its cache
CHUNKS_PER_WINDOW = 32


BLOCK = 4096  # indices turned into Python ints at a time


def as_ints(order: np.ndarray) -> Iterator[int]:
    """The indices of ``order`` as Python ints (as torch's samplers yield them), a block at a time."""
    for start in range(0, len(order), BLOCK):
        yield from order[start:start + BLOCK].tolist()


def quasi_random(n: int, chunk: int, window: int, generator: torch.Generator) -> np.ndarray:
    """A permutation of ``range(n)``: shuffled chunks of consecutive records, shuffled within windows."""
    chunks = torch.randperm(-(-n // chunk), generator=generator)
    order = (chunks[:, None] * chunk + torch.arange(chunk)[None, :]).flatten()
    order = order[order < n]
    keys = (torch.arange(len(order)) // window).double() + torch.rand(len(order), generator=generator,
                                                                      dtype=torch.float64)
    return order[torch.argsort(keys, stable=True)].numpy()


def quasi_sizes(budget: int, record_bytes: float) -> tuple:
    """(chunk, window) in records: a window is half the read-ahead ``budget`` (the records requested
    ahead lie in the chunks of two or three windows) and holds ``CHUNKS_PER_WINDOW`` chunks."""
    window = max(1, int(budget / 2 // max(record_bytes, 1)))
    return max(1, window // CHUNKS_PER_WINDOW), window
