"""Decoding a batch's samples on threads in the process that reads it.

The JPEG decoders (simplejpeg, nvimgcodec's CPU backend, Pillow) and torch's
resize release the GIL, so a batch's images decode in parallel on threads
without worker processes, pickling or shared-memory copies.  ``run`` calls
``fn(j)`` for ``j`` in ``range(n)`` on this process's pool of ``threads``
threads (made on first use, made again after a fork: a pool's threads do not
survive one) and re-raises the first exception, so an error names its record as
a serial read would.  ``make_loader`` chooses the thread count
(``plan.decode_threads``, ``loaders/plan.py``).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Tuple

_pools: Dict[Tuple[int, int], ThreadPoolExecutor] = {}


def run(fn: Callable[[int], None], n: int, threads: int) -> None:
    if threads <= 1 or n <= 1:
        for j in range(n):
            fn(j)
        return
    for _ in pool(threads).map(fn, range(n)):
        pass


def pool(threads: int) -> ThreadPoolExecutor:
    key = (os.getpid(), threads)
    if key not in _pools:
        _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix="pixfeed-decode")
    return _pools[key]
