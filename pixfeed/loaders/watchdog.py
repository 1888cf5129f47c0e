"""Every wait of the loader on a reader has a bound.

A training job that hangs costs more than one that fails.  ``watched`` wraps
torch's iterator so that no wait on a reader goes unchecked:

* **in process**: ``guard.Guarded`` (a helper thread reads, the caller's wait
  is bounded), unless the epoch's plan says a read cannot wait on storage
  (``epochplan.py``: a warm local dataset), where the loop reads directly.
* **workers**: torch's DataLoader gets ``timeout=POLL``, so a dead worker is
  found within ``POLL`` seconds (torch's SIGCHLD handler is taken off: it
  raises wherever the training thread happens to be, unnamed) and
  raises ``WorkerDiedError`` naming the worker, its pid, the signal, the
  records of the batches it had not delivered and the likely cause (the
  memory cgroup's ``oom_kill`` count tells the out-of-memory killer from a
  plain ``kill -9``).  A batch that cannot be placed in ``/dev/shm``, or
  workers that cannot start for lack of it, raise ``SharedMemoryError``.
* **stuck workers**: while the training thread waits, a monitor thread checks
  the worker it waits on every ``POLL`` seconds (``progress.Stall``).  After
  ``stall_timeout`` seconds without progress it kills that worker and the
  training thread raises ``LoaderStalledError`` naming the worker, its state,
  the batch's records and the file its read waits on.  The monitor, not the
  training thread, acts because the training thread may itself be blocked
  inside torch: receiving a batch's memory means asking the sending worker
  for a file descriptor, and a stopped worker never answers.  Killing it ends
  that wait too, and a stopped worker would otherwise block shutdown and the
  interpreter's exit.
"""
from __future__ import annotations

import errno
import os
import signal
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Optional

import torch

from pixfeed.errors import LoaderError, PixfeedError, SharedMemoryError, WorkerDiedError
from pixfeed.loaders.guard import Guarded
from pixfeed.loaders.proc import oom_kills, task
from pixfeed.loaders.progress import POLL, Stall, batch_records
from pixfeed.loaders.shm import shm_free_bytes, shortage


def watched(loader: Any, start: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """The loader's batches from ``start()`` (torch's iterator), every wait on them bounded."""
    plan = loader.pixfeed_plan
    if loader.num_workers and shm_free_bytes() < (plan.batch_bytes or 0) * loader.num_workers:
        raise SharedMemoryError(f"/dev/shm filled up since the loader was made: {_shortage(loader)}")
    try:
        batches = start()
    except OSError as error:  # the workers' queues and semaphores live in /dev/shm too
        if error.errno != errno.ENOSPC:
            raise
        raise SharedMemoryError(f"the DataLoader workers could not start: {_shortage(loader)}") from error
    if loader.num_workers:
        return Workers(batches, loader)
    return Guarded(batches, loader) if plan.reader_thread else batches


def _without_sigchld_errors(batches: Any) -> None:
    """Torch's SIGCHLD handler raises its own RuntimeError wherever the training thread is when a worker
    dies, often outside any wait of ours (in the loop body); the bounded waits find the dead worker
    within ``POLL`` seconds instead, and name it."""
    if getattr(batches, "_worker_pids_set", False):
        torch._C._remove_worker_pids(id(batches))
        batches._worker_pids_set = False


def _shortage(loader: Any) -> str:
    plan = loader.pixfeed_plan
    return shortage(plan.batch_bytes or 0, plan.num_workers, shm_free_bytes())


class Workers(Iterator[Any]):
    """Torch's multi-process iterator (made with ``timeout=POLL``), its waits watched."""

    def __init__(self, batches: Any, loader: Any) -> None:
        self.batches, self.loader = batches, loader
        self.stall = Stall(loader.pixfeed_plan.stall_timeout)
        self.oom_kills = oom_kills()
        self.waiting, self.done = False, False
        self.failure: Optional[LoaderError] = None
        _without_sigchld_errors(batches)
        threading.Thread(target=_monitor, args=(weakref.ref(self),), name="pixfeed-watchdog", daemon=True).start()

    def __next__(self) -> Any:
        self.stall.reset()
        self.waiting = True
        try:
            while True:
                try:
                    return next(self.batches)
                except StopIteration:
                    self.done = True
                    raise
                except Exception as error:  # noqa: BLE001 - each case is re-raised, named or as it was
                    if self.failure is not None or not self._timed_out(error):
                        self.done = True
                        explained = self._explain(error)
                        if isinstance(explained, LoaderError):
                            self._shut_down()
                        raise explained from error
        finally:
            self.waiting = False

    def _shut_down(self) -> None:
        """Stop the workers now (left to garbage collection, torch's shutdown waited 5 s per worker) and
        let the loader's next epoch start fresh ones."""
        self.batches._shutdown_workers()
        if getattr(self.loader, "_iterator", None) is self.batches:
            self.loader._iterator = None

    @staticmethod
    def _timed_out(error: Exception) -> bool:
        return isinstance(error, RuntimeError) and str(error).startswith("DataLoader timed out")

    def _explain(self, error: Exception) -> Exception:
        if self.failure is not None:
            return self.failure
        if isinstance(error, PixfeedError):
            return error
        if any(not p.is_alive() for p in self.batches._workers):
            return self._died()
        text = str(error)
        if "No space left on device" in text and "shared memory" in text:
            return SharedMemoryError(f"a worker could not place its batch in shared memory: {_shortage(self.loader)}")
        return error

    def check(self) -> None:
        """Called by the monitor thread while the training thread waits: end a stuck worker."""
        batch = self.batches._rcvd_idx
        worker = self.batches._task_info.get(batch, (None,))[0]
        if worker is None or self.failure is not None:
            return
        pid = self.batches._workers[worker].pid
        snapshot = task(pid)
        if self.stall.stuck((worker, batch), snapshot):
            self.failure = self.stall.error(f"DataLoader worker {worker} (pid {pid})",
                                            batch_records(self.loader, batch), snapshot)
            os.kill(pid, signal.SIGKILL)

    def _died(self) -> WorkerDiedError:
        worker, process = next((w, p) for w, p in enumerate(self.batches._workers) if not p.is_alive())
        pending = sorted(k for k, info in self.batches._task_info.items() if info[0] == worker and len(info) == 1)
        records = "; ".join(batch_records(self.loader, k) for k in pending) or "none"
        return WorkerDiedError(f"DataLoader worker {worker} (pid {process.pid}) {self._how(process.exitcode)}. "
                               f"Its batches not yet received: {records}")

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


def _monitor(ref: "weakref.ref[Workers]") -> None:
    """Check the waited-on worker every POLL seconds; holds no reference between checks, so an
    abandoned iterator is still collected (and its workers shut down)."""
    while True:
        time.sleep(POLL)
        workers = ref()
        if workers is None or workers.done:
            return
        if workers.waiting:
            workers.check()
        del workers
