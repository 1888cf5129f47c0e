"""Batch arrays recycled once nothing refers to them.

A batch of 64 images at 224 is 9.6 MB: allocated afresh for every batch,
glibc hands the freed block back to the kernel and the next batch pays 2,400
page faults and the kernel's zeroing (stored pixels through ``make_loader``
read at 67,000 images/s here instead of 93,000).  ``empty`` hands out a view of
an array this process keeps (up to ``KEEP`` per shape, ``KEEP_BYTES`` in all)
when no view of it is left anywhere: the caller's tensors and arrays hold the view, and the view
holds the kept array, so its reference count says when it is free again.
Nothing is reused while any batch built on it is alive, whoever holds it.
The arrays are this process's own (a forked worker starts without any, so
it never touches its parent's pages).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Dict, List, Tuple

import numpy as np

KEEP = 4  # arrays kept per shape: the batches a loader has alive at once, and one more
KEEP_BYTES = 512 << 20  # at most this much kept per process (4 batches of 256 images at 224 are 154 MB)

_lock = threading.Lock()
_kept: Dict[Tuple[int, tuple, str], List[np.ndarray]] = {}
_FREE = 3  # references to a kept array no view holds: the list, the loop variable, getrefcount's own


def empty(shape: tuple, dtype=np.uint8) -> np.ndarray:
    """An uninitialised array of ``shape``: the first rows of a kept array of that row shape with as many
    rows or more that no batch uses any more, else new.  Kept by row shape, so batches of varying length
    (the last of an epoch, a mixture's group of each source: pixfeed.mixing) reuse them too; with KEEP
    arrays kept, a new one takes the place of the smallest free one."""
    shape = tuple(int(n) for n in shape)
    rows, key = (shape[0] if shape else 1), (os.getpid(), shape[1:] if shape else (), np.dtype(dtype).str)
    with _lock:
        arrays = _kept.setdefault(key, [])
        for arr in arrays:
            if len(arr) >= rows and sys.getrefcount(arr) == _FREE:
                return arr[:rows].reshape(shape)
        arr = np.empty((rows, *key[1]), dtype)
        if len(arrays) >= KEEP:
            free = [j for j in range(len(arrays)) if sys.getrefcount(arrays[j]) == _FREE - 1]  # no loop variable
            if free:
                del arrays[min(free, key=lambda j: len(arrays[j]))]
        kept = sum(a.nbytes for k, v in _kept.items() if k[0] == key[0] for a in v)
        if len(arrays) < KEEP and kept + arr.nbytes <= KEEP_BYTES:
            arrays.append(arr)
        return arr[:rows].reshape(shape)
