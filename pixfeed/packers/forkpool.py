"""A process pool that can always be stopped: forked workers, one pipe each, no shared locks.

``multiprocessing.Pool`` shares one result queue, guarded by a lock, between
its workers.  ``Pool.terminate()`` kills workers wherever they are; one killed
while it sent a result died holding that lock, and the pool's task handler,
whose last step takes the lock, then hung ``terminate()`` for ever (a failed
pack's first error did it about once in a few hundred packs; CI hung on it).

Here each worker has its own pipe to the driver, which hands out one job at a
time and waits on the pipes: stopping early is ``kill`` and ``join``, with no
lock left held, and a worker that dies (killed, out of memory) closes its pipe
and is named at once instead of waited on.  At the normal end each worker is
sent ``None`` and exits by itself.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import sys
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Dict, Iterable, Iterator

from ..errors import PixfeedError
from . import interrupt

EXIT_WAIT_S = 10.0  # for workers to leave at the normal end before they are killed


class WorkerDied(PixfeedError):
    pass


def imap_unordered(fn: Callable[[Any], Any], jobs: Iterable[Any], workers: int,
                   init: Callable[[], None] = lambda: None) -> Iterator[Any]:
    """``fn(job)`` for every job, in ``workers`` forked processes (each runs ``init()`` first, with
    SIGINT and SIGTERM blocked until it returns); yields results as they finish and re-raises the
    first exception a job raised.  ``fn``, ``init`` and what they use reach the workers by fork, not
    by pickling; jobs and results are pickled."""
    ctx = mp.get_context("fork")
    pending = iter(jobs)
    procs: Dict[Connection, Any] = {}
    finished = False
    try:
        with interrupt.deferred():
            for _ in range(workers):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(theirs, fn, init), daemon=True)
                proc.start()
                theirs.close()
                procs[ours] = proc
        busy = [conn for conn, proc in procs.items() if _hand_out(conn, proc, pending)]
        while busy:
            for conn in wait(busy):
                ok, value = _receive(conn, procs[conn])
                if not ok:
                    raise value
                if not _hand_out(conn, procs[conn], pending):
                    busy.remove(conn)
                yield value
        finished = True
    finally:
        for conn in procs:
            if finished:
                conn.send(None)  # leave (the end of the pipe is not enough: later workers hold its copy)
            conn.close()
        for proc in procs.values():
            if finished:
                proc.join(EXIT_WAIT_S)
            if proc.is_alive():
                proc.kill()
            proc.join()


def _hand_out(conn: Connection, proc, pending: Iterator[Any]) -> bool:
    for job in pending:
        try:
            conn.send(job)
        except OSError:
            raise _died(proc) from None
        return True
    return False


def _receive(conn: Connection, proc) -> tuple:
    try:
        return conn.recv()
    except (EOFError, OSError):
        raise _died(proc) from None


def _died(proc) -> WorkerDied:
    proc.join()
    code = proc.exitcode
    how = f"exit code {code}"
    if code is not None and code < 0:
        how = f"signal {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"signal {-code}"
    return WorkerDied(f"a pack worker (pid {proc.pid}) died ({how}) while running a task; if it was killed "
                      "for memory, pack with fewer --workers")


def _serve(conn: Connection, fn: Callable[[Any], Any], init: Callable[[], None]) -> None:
    torch = sys.modules.get("torch")
    if torch is not None:  # as in DataLoader workers: a forked child never gets its parent's OpenMP threads
        torch.set_num_threads(1)
    init()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, interrupt.SIGNALS)
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            result = (True, fn(job))
        except Exception as e:  # the driver raises it
            result = (False, e)
        try:
            conn.send(result)
        except (EOFError, OSError):
            return
        except Exception as e:  # a result or an exception that does not pickle
            conn.send((False, PixfeedError(f"a pack worker could not send its result back: "
                                           f"{type(e).__name__}: {e}")))
