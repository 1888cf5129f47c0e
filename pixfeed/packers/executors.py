"""Where a pack's tasks run: one join, two executors.

``tasks.run_task`` is a pack task (read a slice of the source, turn it into
records, hand them to the writer's ``write_task``); it runs wherever the
executor puts it.  ``run_tasks`` is the join on the driver: it takes task
results in completion order, hands each to the writer's ``task_done`` and
advances the progress bar.  An executor only runs tasks and yields their
results as they finish:

* ``LocalExecutor`` (the default): a process pool on this machine.
* ``RayExecutor`` (``pixfeed.packers.ray_executor``, the ``pixfeed[ray]``
  extra): Ray tasks on a cluster (or a local Ray).

A task may run more than once (Ray retries a task whose worker died), so a
writer's ``write_task`` writes its output idempotently: rows in place, or
files it creates afresh (opened with truncation) under names of its own.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, List, Optional

import numpy as np

from ..machine.cpus import available_cpus
from ..errors import OptionError, SourceError
from . import forkpool, interrupt
from .sizes import upscale_note
from .tasks import Executor, first_bad, run_task
from .writer import TaskResult, Writer

EXECUTORS = ("local", "ray")


def run_tasks(writer: Writer, tasks: List[np.ndarray], executor: "Executor", progress: bool,
              done: Callable[[TaskResult], None] = lambda r: None) -> List[TaskResult]:
    """Run ``tasks`` on ``executor``; the driver's join (``done`` sees each result after
    the writer).  Results sorted by task."""
    from ..console.progress import Bar

    results = []
    bar = Bar(total=len(writer.source), unit="img", disable=not progress, dynamic_ncols=True)
    try:
        with bar, contextlib.closing(executor.run(writer, tasks)) as outputs:
            for r in outputs:
                interrupt.check()
                results.append(r)
                writer.task_done(r)
                done(r)
                bar.update(len(tasks[r.task]))
    except SourceError as e:  # named as the first bad image in source order, in every format (tasks.first_bad)
        first = first_bad(writer, tasks, [r.task for r in results], e)
        if first is e:
            raise
        raise first from None
    results.sort(key=lambda r: r.task)
    note = upscale_note(results, writer.opts, writer.source)
    if note and results:
        results[0].notes.append(note)  # a pack-wide note, carried with the first task's into the manifest's notes
    return results


def _init_worker(parent: int) -> None:
    """Pool workers leave Ctrl-C to the main process (which kills them), die on SIGTERM whatever
    handlers the parent had installed before forking, and die with the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    interrupt.die_with_parent(parent)


class LocalExecutor(Executor):
    """``workers`` forked processes on this machine (after ``writer.begin``; ``forkpool.py``)."""

    def __init__(self, workers: Optional[int] = None) -> None:
        self.slots = workers or available_cpus()

    def run(self, writer: Writer, tasks: List[np.ndarray]) -> Iterator[TaskResult]:
        jobs = list(enumerate(tasks))
        workers = min(self.slots, len(tasks))
        if workers == 1:
            yield from (run_task(writer, *job) for job in jobs)
            return
        if "fork" not in mp.get_all_start_methods():
            raise OptionError("--executor local needs fork (Linux, macOS); use --workers 1 or --executor ray")
        parent = os.getpid()
        yield from forkpool.imap_unordered(lambda job: run_task(writer, *job), jobs, workers,
                                           init=lambda: _init_worker(parent))

    def _as_done(self, fn: Callable, items: List) -> Iterator:
        workers = min(self.slots, len(items))
        if workers <= 1:
            yield from map(fn, items)
        elif threading.active_count() == 1 and "fork" in mp.get_all_start_methods():
            yield from forkpool.imap_unordered(fn, items, workers)  # fn reaches the workers by fork: not pickled
        else:  # threads here (a server, a notebook's kernel): a fork would copy their locks mid-use
            with ThreadPoolExecutor(workers) as pool:
                yield from pool.map(fn, items)


def make_executor(name, workers: Optional[int] = None, address: Optional[str] = None,
                  task_cpus: Optional[float] = None) -> Executor:
    """The executor called ``name`` ("local" or "ray"), or ``name`` itself if it is one."""
    if isinstance(name, Executor):
        return name
    if name not in EXECUTORS:
        raise OptionError(f"--executor {name!r}: expected {' or '.join(EXECUTORS)}")
    if name == "local":
        if address is not None or task_cpus is not None:
            given = "--address" if address is not None else "--task-cpus"
            raise OptionError(f"{given} applies to --executor ray only; leave it out or pass --executor ray")
        return LocalExecutor(workers)
    if workers is not None:
        raise OptionError("--workers applies to --executor local; with --executor ray every CPU of the cluster "
                          "runs tasks (use --task-cpus to give each task more)")
    try:
        import ray  # noqa: F401
    except ImportError:
        raise OptionError("--executor ray needs Ray, which is not installed: pip install 'pixfeed[ray]'") from None
    from .ray_executor import RayExecutor

    return RayExecutor(address, task_cpus)
