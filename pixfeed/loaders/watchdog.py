"""Every wait of the loader on a reader has a bound.

A training job that hangs costs more than one that fails.  ``PixfeedLoader``
never waits on a reader without checking on it every ``POLL`` seconds:

* **workers** (``Workers``): torch's DataLoader gets ``timeout=POLL``; each
  expiry checks the worker whose batch the loader waits for.  A worker that
  died (killed, out of memory, crashed) raises ``WorkerDiedError`` naming the
  worker, its pid, the signal, the batch's records and the likely cause (the
  memory cgroup's ``oom_kill`` count tells the out-of-memory killer from a
  plain ``kill -9``).  A batch that cannot be placed in ``/dev/shm`` raises
  ``SharedMemoryError`` with the free space and the fix.
* **in process** (``Guarded``): batches are read in a helper thread, one per
  request (no reading ahead), so the training thread waits with a bound.
* **stuck readers**: a reader that made no progress (``proc.py``: no CPU time,
  no page fault, no byte read) for ``stall_timeout`` seconds raises
  ``LoaderStalledError`` naming it, the batch's records, the file its system
  call waits on and the likely cause (stopped, storage not answering).  A slow
  reader that still reads or computes is never stopped.
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import time
from typing import Any, Iterator, List, Optional

from torch.utils.data import DistributedSampler

from pixfeed.errors import LoaderStalledError, PixfeedError, SharedMemoryError, WorkerDiedError
from pixfeed.loaders.proc import Task, oom_kills, task
from pixfeed.loaders.shm import shm_free_bytes, shortage

POLL = 1.0  # seconds between checks while the loader waits on a reader


class RecordedSampler(DistributedSampler):
    """A DistributedSampler that keeps the epoch's order, so a stalled batch's records can be named."""

    order: List[int] = []

    def __iter__(self) -> Iterator[int]:
        self.order = list(super().__iter__())
        return iter(self.order)


def batch_records(loader: Any, batch: int) -> str:
    """The records of the epoch's ``batch``-th batch, as the error messages name them."""
    order = getattr(loader.sampler, "order", None)
    if not order:
        return f"batch {batch} of the stream"
    records = order[batch * loader.batch_size:(batch + 1) * loader.batch_size]
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


class Workers(Iterator[Any]):
    """Torch's multi-process iterator (made with ``timeout=POLL``), its waits checked."""

    def __init__(self, batches: Any, loader: Any) -> None:
        self.batches, self.loader = batches, loader
        self.stall = Stall(loader.pixfeed_plan.stall_timeout)
        self.oom_kills = oom_kills()

    def __next__(self) -> Any:
        self.stall.reset()
        while True:
            try:
                return next(self.batches)
            except RuntimeError as error:
                text = str(error)
                if isinstance(error, PixfeedError):
                    raise
                if text.startswith("DataLoader worker (pid"):
                    raise self._died() from error
                if "No space left on device" in text and "shared memory" in text:
                    plan = self.loader.pixfeed_plan
                    raise SharedMemoryError(f"a worker could not place its batch in shared memory: "
                                            f"{shortage(plan.batch_bytes or 0, plan.num_workers, shm_free_bytes())}"
                                            ) from error
                if not text.startswith("DataLoader timed out"):
                    raise
                self._check_waited_worker()

    def _check_waited_worker(self) -> None:
        batch = self.batches._rcvd_idx
        worker = self.batches._task_info.get(batch, (None,))[0]
        if worker is None:
            return
        pid = self.batches._workers[worker].pid
        snapshot = task(pid)
        if self.stall.stuck((worker, batch), snapshot):
            raise self.stall.error(f"DataLoader worker {worker} (pid {pid})", batch_records(self.loader, batch),
                                   snapshot)

    def _died(self) -> WorkerDiedError:
        dead = [(w, p) for w, p in enumerate(self.batches._workers) if not p.is_alive()]
        if not dead:
            return WorkerDiedError("a DataLoader worker exited unexpectedly")
        worker, process = dead[0]
        pending = sorted(k for k, info in self.batches._task_info.items() if info[0] == worker and len(info) == 1)
        records = batch_records(self.loader, pending[0]) if pending else "no batch"
        return WorkerDiedError(f"DataLoader worker {worker} (pid {process.pid}) {self._how(process.exitcode)} "
                               f"while reading {records}")

    def _how(self, code: Optional[int]) -> str:
        if code is None or code >= 0:
            return f"exited with status {code} (sys.exit or os._exit in the dataset or a library?)"
        name = signal.Signals(-code).name
        kills = oom_kills()
        if name == "SIGKILL" and kills > self.oom_kills:
            return (f"was killed by SIGKILL from the kernel's out-of-memory killer (the memory cgroup's oom_kill "
                    f"count rose from {self.oom_kills} to {kills}): give the job more memory, or use fewer "
                    "workers or smaller batches")
        causes = {"SIGKILL": "the out-of-memory killer (see dmesg) or a kill -9",
                  "SIGBUS": f"shared memory ran out ({shm_free_bytes() >> 20} MiB free in /dev/shm) or a mapped "
                            "file was truncated",
                  "SIGSEGV": "a crash in native code (an image decoder, a C extension)"}
        return f"was killed by {name}: likely {causes.get(name, 'a crash in native code or a signal sent to it')}"


class Guarded(Iterator[Any]):
    """Reads ``source`` in a helper thread, one item per request, so the caller's wait has a bound."""

    def __init__(self, source: Iterator[Any], loader: Any) -> None:
        self.loader, self.batch, self.done = loader, 0, False
        self.stall = Stall(loader.pixfeed_plan.stall_timeout)
        self._requests: "queue.Queue[bool]" = queue.Queue()
        self._results: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._serve, args=(source,), name="pixfeed-reader", daemon=True)
        self._thread.start()

    def _serve(self, source: Iterator[Any]) -> None:
        while self._requests.get():
            try:
                self._results.put((True, next(source)))
            except BaseException as error:  # StopIteration included: re-raised in the caller
                self._results.put((False, error))

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        self._requests.put(True)
        self.stall.reset()
        while True:
            try:
                ok, item = self._results.get(timeout=POLL)
                break
            except queue.Empty:
                snapshot = task(os.getpid(), self._thread.native_id)
                if self.stall.stuck(self.batch, snapshot):
                    self.close()
                    raise self.stall.error("the in-process reader", batch_records(self.loader, self.batch),
                                           snapshot) from None
        if not ok:
            self.close()
            raise item
        self.batch += 1
        return item

    def close(self) -> None:
        """Let the thread end (at once when idle, after its current read otherwise)."""
        self.done = True
        self._requests.put(False)

    def __del__(self) -> None:
        if not self.done:
            self.close()
