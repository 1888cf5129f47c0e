"""Pack tasks as Ray tasks (``--executor ray``; needs the ``pixfeed[ray]`` extra).

The driver plans the tasks as for the local executor and puts the writer
(with the source listing, never image bytes) into Ray's object store once;
each task fetches it once per worker process (a small cache keyed by the
object), reads its slice of the source and writes its part of the output,
so every node must see the source and the temporary output folder (a shared
file system).  Results come back as tasks finish (``ray.wait``) and go
through the same join as local results (``executors.run_tasks``).

Cluster: a Ray already initialised in this process (used as it is), else
``address`` (``--address``), else ``RAY_ADDRESS``, else a local Ray started
on this machine's CPUs (no dashboard, logs under Ray's temporary folder);
one the pack started is shut down after it.  Each task takes ``task_cpus`` CPUs (default 1).

Faults: a task whose worker dies is retried up to ``MAX_RETRIES`` times and
rewrites its part from scratch; a task that raises (a bad image under
``--on-error fail``) is not retried: the other tasks are cancelled and the
error is raised as the task raised it.

Test-only hook: when the environment variable ``PIXFEED_TEST_CRASH_DIR`` is
set in the workers and that folder holds a file ``task-K``, the first attempt
of task K removes the file and exits its worker abruptly after one record,
which is how the tests kill a worker mid-task.  Never set it outside tests.
"""
from __future__ import annotations

import copy
import logging
import os
import socket
from typing import Callable, Iterator, List, Optional

import numpy as np
import ray

from ..machine.cpus import available_cpus
from ..errors import OptionError
from .tasks import Executor, run_task
from .writer import TaskResult, Writer

MAX_RETRIES = 3
CRASH_DIR_ENV = "PIXFEED_TEST_CRASH_DIR"
_CANCEL_WAIT_S = 30
_WRITERS: dict = {}  # this worker's writer: object id -> writer


def _task(holder: list, task: int, indices: np.ndarray) -> TaskResult:
    """A Ray task; ``holder`` wraps the writer's ObjectRef so Ray does not fetch it for every task."""
    key = holder[0].hex()
    if key not in _WRITERS:
        _WRITERS.clear()
        _WRITERS[key] = ray.get(holder[0])
    return run_task(_crash_hook(_WRITERS[key], task), task, indices)


def _crash_hook(writer: Writer, task: int) -> Writer:
    """``writer``, or (test-only, see the module docstring) a copy whose ``write_task``
    exits the worker after the first record."""
    folder = os.environ.get(CRASH_DIR_ENV)
    if not folder:
        return writer
    try:
        os.unlink(os.path.join(folder, f"task-{task}"))
    except FileNotFoundError:
        return writer
    crashing = copy.copy(writer)
    crashing.write_task = lambda t, indices, records: writer.write_task(t, indices, _exit_after_first(records))
    return crashing


def _exit_after_first(records: Iterator) -> Iterator:
    yield next(records)
    os._exit(1)


_remote_task = ray.remote(_task)


class RayExecutor(Executor):
    def __init__(self, address: Optional[str] = None, task_cpus: Optional[float] = None) -> None:
        if task_cpus is not None and not task_cpus > 0:
            raise OptionError(f"--task-cpus {task_cpus}: must be a positive number of CPUs")
        self.address, self.task_cpus = address, task_cpus or 1
        self._started = False
        if address:
            _check_reachable(address)

    def __enter__(self) -> "RayExecutor":
        if not ray.is_initialized():
            self._connect()
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < self.task_cpus:
            raise OptionError(f"--task-cpus {self.task_cpus}: the Ray cluster has only {cpus:g} CPUs")
        self.slots = int(cpus // self.task_cpus)
        return self

    def _connect(self) -> None:
        address = self.address or os.environ.get("RAY_ADDRESS")
        quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
        if address:
            try:
                ray.init(address=address, **quiet)
            except ConnectionError as e:  # "auto" with no cluster running, a dead head node
                given = f"--address {address}" if self.address else f"RAY_ADDRESS={address}"
                reason = str(e).split(". ")[0]
                raise OptionError(f"{given}: no Ray cluster answers there ({reason}); start one with "
                                  "`ray start --head` or give the head node's HOST:PORT") from None
        else:
            ray.init(address="local", num_cpus=available_cpus(), include_dashboard=False, **quiet)
        self._started = True

    def __exit__(self, *exc) -> None:
        if self._started:
            ray.shutdown()
            self._started = False

    def run(self, writer: Writer, tasks: List[np.ndarray]) -> Iterator[TaskResult]:
        holder = [ray.put(writer)]
        remote = _remote_task.options(num_cpus=self.task_cpus, max_retries=MAX_RETRIES)
        yield from _as_done([remote.remote(holder, task, indices) for task, indices in enumerate(tasks)])


    def _as_done(self, fn: Callable, items: List) -> Iterator:
        remote = ray.remote(num_cpus=self.task_cpus, max_retries=MAX_RETRIES)(fn)  # fn goes by cloudpickle
        yield from _as_done([remote.remote(item) for item in items])


def _as_done(pending: list) -> Iterator:
    """Each task's result as it finishes; the rest cancelled when closed early."""
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield _result(done[0])
    finally:
        _cancel(pending)


def _check_reachable(address: str) -> None:
    """Refuse a HOST:PORT nobody listens on (Ray would retry it for minutes); other forms
    (``auto``, ``ray://...``) are left to Ray."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as e:
        raise OptionError(f"--address {address}: no Ray cluster answers there ({e.strerror or e}); "
                          "start one with `ray start --head` or give the head node's HOST:PORT") from None


def _result(ref) -> TaskResult:
    """A finished task's result; a task's own error is raised as itself (the Ray error chained)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, Exception):
            raise e.cause from e
        raise


def _cancel(pending: list) -> None:
    """Stop the tasks still queued or running and wait until they are gone, so none writes after the pack failed."""
    for ref in pending:
        ray.cancel(ref, force=True)
    if pending:
        ray.wait(pending, num_returns=len(pending), timeout=_CANCEL_WAIT_S)
