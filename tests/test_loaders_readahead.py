"""ReadAhead: order kept, errors re-raised, the thread stops when abandoned."""
from __future__ import annotations

import time

import pytest

from pixfeed.loaders.batch import ReadAhead


def test_yields_everything_in_order_then_stops():
    items = ReadAhead(iter(range(50)), depth=3)
    assert list(items) == list(range(50))
    with pytest.raises(StopIteration):
        next(items)


def test_error_in_source_is_raised_to_the_consumer():
    def source():
        yield 1
        raise ValueError("bad record 2")

    items = ReadAhead(source())
    assert next(items) == 1
    with pytest.raises(ValueError, match="bad record 2"):
        next(items)


def test_abandoned_reader_thread_exits():
    items = ReadAhead(iter(range(10**9)), depth=2)
    assert next(items) == 0
    items.close()
    items._thread.join(timeout=5)
    assert not items._thread.is_alive()


def test_reads_ahead_while_consumer_waits():
    pulled = []

    def source():
        for i in range(5):
            pulled.append(i)
            yield i

    items = ReadAhead(source(), depth=2)
    deadline = time.monotonic() + 5
    while len(pulled) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pulled == [0, 1, 2]  # two queued, one waiting to be queued
    assert list(items) == list(range(5))
