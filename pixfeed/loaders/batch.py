"""Whole-batch reads (``BatchReader``) and the optional reader thread (``ReadAhead``).

A dataset with ``get_batch`` and one shape for every sample (``fixed_shape``)
returns a whole batch per call: for stored pixels one gathered copy out of the
memory map, for encoded images one read (a transaction, a gather) and then
the decodes, with no per-sample tensors and no ``collate`` stacking.
``BatchReader`` exposes that through DataLoader's ``__getitems__`` hook, so the
DataLoader keeps its ordinary sampler, batch size and length, in process or in
workers alike (``plan.choose_path``).

Where the batch is read is the plan's choice (``plan.choose_workers``): stored
pixels in the training process, because a worker would copy every batch into
fresh shared memory, which costs more than the read itself
(``benchmarks/loader_paths.py``); decoding datasets in workers, or, without
workers, on a pool of threads in the training process
(``plan.choose_decode_threads``).
``ReadAhead`` reads the next batches in a thread; NumPy copies release the GIL,
so it overlaps reading with a training step that blocks.  It is off unless
``read_ahead=True`` (``plan.choose_read_ahead`` says why).
"""
from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from typing import Any, Callable, Iterator, List, Tuple

import torch
from torch.utils.data import Dataset

from pixfeed.datasets.protocol import BatchDataset

Batch = Tuple[torch.Tensor, torch.Tensor]


def supports_batches(dataset: Any) -> bool:
    return isinstance(dataset, BatchDataset) and dataset.fixed_shape is not None


class BatchReader(Dataset):
    """Wraps a dataset with ``get_batch``; DataLoader then reads one batch per call, its images
    decoded on ``threads`` threads (``plan.choose_decode_threads``)."""

    def __init__(self, dataset: Any, threads: int = 1) -> None:
        self.dataset, self.threads = dataset, threads

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: List[int]) -> Batch:
        if self.threads > 1:
            return self.dataset.get_batch(indices, threads=self.threads)
        return self.dataset.get_batch(indices)


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_DONE = object()
_LIVE: "weakref.WeakSet[ReadAhead]" = weakref.WeakSet()  # read-aheads whose thread may still run
EXIT_WAIT = 5.0  # seconds the interpreter's exit waits in all for pixfeed's threads to leave what they are in
AT_EXIT: List[Callable[[], List[threading.Thread]]] = []  # more threads to stop at exit (the device stage's)


@atexit.register
def stop_threads() -> None:
    """At the interpreter's exit, every read-ahead thread is stopped and given ``EXIT_WAIT`` seconds in all to
    finish the batch it is making.  A daemon thread still inside a torch kernel when the interpreter tears torch
    down aborts the process ("terminate called without an active exception", exit status 134): a script that
    leaves an epoch part-way and returns while batches are made ahead."""
    threads = [t for stop in AT_EXIT for t in stop()]
    for ahead in list(_LIVE):
        ahead._stop.set()
        threads.append(ahead._thread)
    deadline = time.monotonic() + EXIT_WAIT
    for thread in threads:
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


class ReadAhead(Iterator[Any]):
    """Pulls items from ``source`` in a daemon thread, up to ``depth`` ahead."""

    def __init__(self, source: Iterator[Any], depth: int = 2) -> None:
        self._queue: "queue.Queue[Any]" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._fill, args=(source,), name="pixfeed-read-ahead", daemon=True)
        _LIVE.add(self)
        self._thread.start()

    def _fill(self, source: Iterator[Any]) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
        except BaseException as error:  # re-raised in the consuming thread
            self._put(_Failure(error))
            return
        self._put(_DONE)

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if item is _DONE or isinstance(item, _Failure):
            self._finished = True
            self.close()
        if item is _DONE:
            raise StopIteration
        if isinstance(item, _Failure):
            raise item.error
        return item

    def close(self) -> None:
        """Stop the thread; called on exhaustion, error or garbage collection."""
        self._stop.set()

    def __del__(self) -> None:
        self.close()
