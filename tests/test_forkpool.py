"""The pack process pool: results, a job's error, a dead worker, and stopping early with workers mid-send."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from pixfeed.errors import SourceError
from pixfeed.packers.forkpool import WorkerDied, imap_unordered


def children():
    with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
        return set(f.read().split())


def test_every_job_runs_once_and_workers_leave():
    before = children()
    assert sorted(imap_unordered(lambda x: x * x, range(50), 3)) == [x * x for x in range(50)]
    assert children() == before


def test_results_and_jobs_cross_by_pickle_and_the_function_by_fork():
    table = {i: np.full(3, i) for i in range(5)}  # reaches the workers by fork
    got = dict(imap_unordered(lambda i: (i, table[i] * 2), range(5), 2))
    assert all(np.array_equal(got[i], np.full(3, 2 * i)) for i in range(5))


def test_a_jobs_error_is_raised_and_no_worker_is_left():
    before = children()

    def job(i):
        if i == 7:
            raise SourceError(f"input {i}: bad")
        return i
    with pytest.raises(SourceError, match="input 7: bad"):
        list(imap_unordered(job, range(40), 2))
    assert children() == before


def test_stopping_while_workers_send_large_results_never_hangs():
    """The multiprocessing.Pool hang: workers killed mid-send of results nobody reads any more."""
    big = np.zeros(1 << 20, np.uint8)  # 1 MiB results fill the pipe, so a worker is always mid-send

    def job(i):
        if i == 3:
            raise SourceError("stop")
        return big
    for _ in range(30):
        start = time.monotonic()
        with pytest.raises(SourceError):
            list(imap_unordered(job, range(200), 2))
        assert time.monotonic() - start < 20


def test_a_worker_that_dies_is_named():
    def job(i):
        if i == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.01)
        return i
    with pytest.raises(WorkerDied, match=r"pack worker \(pid \d+\) died \(signal SIGKILL\)"):
        list(imap_unordered(job, range(10), 2))


def test_closing_the_iterator_early_stops_the_workers():
    before = children()
    results = imap_unordered(lambda i: time.sleep(0.05) or i, range(100), 2)
    next(results)
    results.close()
    assert children() == before
