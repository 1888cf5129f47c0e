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
"""
from __future__ import annotations

from typing import List

import torch

ORDERS = ("random", "quasi_random")
CHUNKS_PER_WINDOW = 32


def quasi_random(n: int, chunk: int, window: int, generator: torch.Generator) -> List[int]:
    """A permutation of ``range(n)``: shuffled chunks of consecutive records, shuffled within windows."""
    chunks = torch.randperm(-(-n // chunk), generator=generator)
    order = (chunks[:, None] * chunk + torch.arange(chunk)[None, :]).flatten()
    order = order[order < n]
    keys = (torch.arange(len(order)) // window).double() + torch.rand(len(order), generator=generator,
                                                                      dtype=torch.float64)
    return order[torch.argsort(keys, stable=True)].tolist()


def quasi_sizes(budget: int, record_bytes: float) -> tuple:
    """(chunk, window) in records: a window is half the read-ahead ``budget`` (the records requested
    ahead lie in the chunks of two or three windows) and holds ``CHUNKS_PER_WINDOW`` chunks."""
    window = max(1, int(budget / 2 // max(record_bytes, 1)))
    return max(1, window // CHUNKS_PER_WINDOW), window
