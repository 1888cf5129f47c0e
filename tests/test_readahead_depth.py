"""Read-ahead with depth (#47 item 1): the records ahead read by a pool of threads (``storage.depth.Reads``)."""
from __future__ import annotations

import errno
import os
import threading
import time

import numpy as np
import pytest

from conftest import make_tree
from pixfeed.datasets import open_dataset
from pixfeed.errors import OptionError
from pixfeed.loaders import cacheplan, epochplan, make_loader, readahead
from pixfeed.packers import pack
from pixfeed.storage import depth
from pixfeed.storage.pagecache import Extents, evict, resident_fraction

BLOCK = 64 << 10


class Recording:
    """os.preadv's stand-in: records (offset, length) of each read; ``gate`` (an Event) holds every read."""

    def __init__(self, gate=None, error=None):
        self.calls, self.gate, self.error, self.lock = [], gate, error, threading.Lock()

    def __call__(self, fd, buffers, offset):
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            self.calls.append((offset, len(buffers[0])))
        if self.error is not None:
            raise self.error
        return len(buffers[0])


def wait_for(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.002)
    return condition()


def depth_threads():
    return [t for t in threading.enumerate() if t.name == "pixfeed-io-depth"]


def test_ranges_are_read_in_file_order_merged_where_near_and_cut_into_pieces():
    begins, ends, tags = depth.coalesce(np.array([30, 10, 0, 5, 60, 100_000, 7]), np.array([10, 10, 10, 3, 1, 5, 0]),
                                        np.array([6, 5, 4, 3, 2, 1, 9]), near=30)
    assert begins.tolist() == [0, 100_000] and ends.tolist() == [61, 100_005]  # within 30 bytes: one read
    assert tags.tolist() == [6, 1]  # the last position each read serves; a length of 0 is no range
    rows = depth.pieces(np.array([0, 5000]), np.array([2500, 5001]), np.array([3, 4]), piece=1000)
    assert rows.tolist() == [[0, 1000, 3], [1000, 1000, 3], [2000, 500, 3], [5000, 1, 4]]


def test_the_pool_reads_exactly_the_coalesced_pieces_once(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"\0" * (8 * BLOCK))
    reader = Recording()
    reads = depth.Reads(path, 4, read=reader, piece=2 * BLOCK)
    rng = np.random.default_rng(0)
    asked = rng.permutation([0, 1, 2, 5, 6])  # blocks 0-2 and 5-6 touch; 3, 4 and 7 are not asked for
    reads.add(asked * BLOCK, np.full(5, BLOCK))
    assert reads.wait_idle(time.monotonic() + 10)
    reads.close()
    assert sorted(reader.calls) == [(0, 2 * BLOCK), (2 * BLOCK, BLOCK), (5 * BLOCK, 2 * BLOCK)]
    assert reads.reads == 3 and reads.bytes == 5 * BLOCK and not depth_threads()


def test_the_pool_fills_the_page_cache_with_the_ranges_asked_for_and_nothing_else(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(64 * BLOCK))
    evict([path])
    if resident_fraction([path]) != 0.0:
        pytest.skip("this file system keeps evicted pages (tmpfs?)")
    records = np.random.default_rng(1).permutation(32)  # the first half of the file, as 32 records in any order
    reads = depth.Reads(path, 8)
    reads.add(records * BLOCK, np.full(32, BLOCK))
    assert reads.wait_idle(time.monotonic() + 30)
    reads.close()
    assert reads.reads == 2 and reads.bytes == 32 * BLOCK  # two pieces of a MiB: 32 records coalesced
    assert resident_fraction([path]) == pytest.approx(0.5, abs=0.02)  # no kernel read-ahead past them


def test_queued_pieces_are_dropped_when_stopped_and_stale_ones_skipped(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"\0" * (64 * BLOCK))
    gate = threading.Event()
    reader = Recording(gate)
    reads = depth.Reads(path, 2, lag=3, read=reader, piece=BLOCK)
    reads.add(np.arange(0, 64, 2) * BLOCK, np.full(32, BLOCK), np.arange(32))  # 32 pieces, positions 0..31
    assert wait_for(lambda: reads._busy == 2)  # two reads held in flight
    reads.stop()
    gate.set()
    reads.close()
    assert len(reader.calls) == 2 and not depth_threads()  # the 30 queued were never read

    reader = Recording()
    reads = depth.Reads(path, 1, lag=3, read=reader, piece=BLOCK)
    reads.position = 10  # the reader passed positions 0..6 more than 3 ago: those pieces are skipped
    reads.add(np.arange(0, 64, 2) * BLOCK, np.full(32, BLOCK), np.arange(32))
    assert reads.wait_idle(time.monotonic() + 10)
    reads.close()
    assert sorted(offset // BLOCK // 2 for offset, _ in reader.calls) == list(range(7, 32))


def records_file(tmp_path, count=400, length=3000):
    path = tmp_path / "records.bin"
    path.write_bytes(os.urandom(count * length))
    starts = np.arange(count, dtype=np.int64) * length
    return path, Extents(path, starts, np.full(count, length, np.int64))


def covered(calls, total):
    """Bytes read: how many times each byte of the file was read."""
    hits = np.zeros(total, np.int32)
    for offset, length in calls:
        hits[offset:offset + length] += 1
    return hits


def test_the_hinter_reads_every_record_of_the_order_with_depth_instead_of_advising(tmp_path, monkeypatch):
    path, extents = records_file(tmp_path)
    reader = Recording()
    monkeypatch.setattr(readahead, "Reads", lambda p, d, lag: depth.Reads(p, d, lag, read=reader, piece=8192,
                                                                            near=0))  # no gap read: exact counts
    monkeypatch.setattr(readahead, "will_need", lambda *a: pytest.fail("advised with depth on"))
    order = np.random.default_rng(2).permutation(400)
    handed = []
    for index in readahead.Hinter(extents, 60_000, depth=4).follow(order):
        handed.append(index)
        if len(handed) == 1:  # the first top-up reaches a budget's worth of records ahead
            assert wait_for(lambda: (covered(list(reader.calls), 1_200_000) > 0).sum() >= 57_000)
        # a reader waits for its record (a page being read is waited on): then none is left behind
        assert wait_for(lambda: covered(list(reader.calls), 1_200_000)[index * 3000:(index + 1) * 3000].all())
    assert handed == order.tolist()
    assert wait_for(lambda: not depth_threads())
    hits = covered(reader.calls, 1_200_000)
    assert hits.min() == 1 and hits.max() == 1  # every byte of every record read once
    assert all(length <= 8192 for _, length in reader.calls)
    assert len(reader.calls) < 400  # neighbours merged into longer reads


def test_dropping_the_iteration_ends_the_pool(tmp_path, monkeypatch):
    path, extents = records_file(tmp_path)
    gate = threading.Event()
    reader = Recording(gate)
    monkeypatch.setattr(readahead, "Reads", lambda p, d, lag: depth.Reads(p, d, lag, read=reader, piece=4096))
    follow = readahead.Hinter(extents, 600_000, depth=3).follow(np.arange(400))
    assert next(follow) == 0
    assert wait_for(lambda: len(depth_threads()) == 3)
    follow.close()  # the loader dropped its iteration with ~150 pieces queued
    gate.set()
    assert wait_for(lambda: not depth_threads())
    assert len(reader.calls) <= 3 + 3  # the reads in flight, and none queued after the stop


@pytest.mark.parametrize("damage", ["vanished", "truncated", "read error"])
def test_a_vanished_or_truncated_file_stops_the_reads_not_the_reading(tmp_path, monkeypatch, damage):
    path, extents = records_file(tmp_path)
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    if damage == "vanished":
        path.unlink()
    elif damage == "truncated":
        os.truncate(path, 100_000)
    else:
        reader = Recording(error=OSError(errno.EIO, "I/O error"))
        monkeypatch.setattr(readahead, "Reads", lambda p, d, lag: depth.Reads(p, d, lag, read=reader))
    assert list(readahead.Hinter(extents, 100_000, depth=4).follow(np.arange(400))) == list(range(400))
    assert wait_for(lambda: not depth_threads())
    assert not failures


def test_the_queue_holds_pieces_not_records(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"\0" * (4 << 20))
    gate = threading.Event()
    reads = depth.Reads(path, 1, read=Recording(gate))
    reads.add(np.arange(4000, dtype=np.int64) * 1000, np.full(4000, 1000, np.int64), np.arange(4000))
    queued = len(reads._queue)
    reads.stop()
    gate.set()
    reads.close()
    assert queued <= 4  # 4,000 touching records: 4 pieces of a MiB (one may be in flight)


def test_willneed_is_found_honoured_or_ignored_by_asking_mincore(tmp_path, monkeypatch):
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(64 * BLOCK))
    evict([path])
    if resident_fraction([path]) != 0.0:
        pytest.skip("this file system keeps evicted pages (tmpfs?)")
    assert depth.willneed_honoured(path, seconds=10) is True  # the pages advised were read (at once: no timing)
    path.read_bytes()
    assert depth.willneed_honoured(path) is None  # every page cached: nothing to tell
    evict([path])
    monkeypatch.setattr(depth.os, "posix_fadvise", lambda *a: None)  # a file system that ignores the advice
    assert depth.willneed_honoured(path, seconds=0.05) is False
    assert depth.willneed_honoured(tmp_path / "absent") is None


def test_io_depth_by_default_is_willneed_where_honoured_and_threads_where_ignored(tmp_path, monkeypatch):
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * BLOCK)
    monkeypatch.setattr(depth, "_CHOSEN", {})
    monkeypatch.setattr(depth, "willneed_honoured", lambda p: True)
    chosen, why = depth.choose_io_depth(path)
    assert chosen == 0 and "WILLNEED) is honoured here" in why and "io_depth=N" in why
    monkeypatch.setattr(depth, "willneed_honoured", lambda p: False)
    assert depth.choose_io_depth(path)[0] == 0  # asked once per device and process
    monkeypatch.setattr(depth, "_CHOSEN", {})
    for spinning, expected in ((True, depth.ROTATIONAL_DEPTH), (False, depth.SOLID_DEPTH), (None, depth.SOLID_DEPTH)):
        monkeypatch.setattr(depth, "rotational", lambda p: spinning)
        depth._CHOSEN.clear()
        chosen, why = depth.choose_io_depth(path)
        assert chosen == expected and "ignores posix_fadvise(WILLNEED)" in why and f"by {expected} threads" in why


@pytest.fixture(scope="module")
def pixels(tmp_path_factory):
    root = tmp_path_factory.mktemp("depth")
    pack(make_tree(root / "src", per_class=8), root / "pixels", "mmap", store="pixels", size=16, workers=1)
    return root / "pixels"


def test_the_loader_reads_with_the_depth_in_its_plan(pixels, monkeypatch):
    monkeypatch.setattr(epochplan, "resident_fraction", lambda files, runs=None: 0.0)  # cold: hints on
    monkeypatch.setattr(depth, "_CHOSEN", {})
    monkeypatch.setattr(depth, "willneed_honoured", lambda p: False)  # a file system that ignores WILLNEED
    plan = make_loader(open_dataset(pixels), 4, num_workers=0).pixfeed_plan
    assert plan.io_depth >= 1 and "threads at once" in plan.reasons["io_depth"] and "io_depth" in str(plan)
    monkeypatch.setattr(depth, "_CHOSEN", {})
    monkeypatch.setattr(depth, "willneed_honoured", lambda p: True)
    plan = make_loader(open_dataset(pixels), 4, num_workers=0).pixfeed_plan
    assert plan.io_depth == 0 and "WILLNEED" in plan.reasons["io_depth"]
    expected = [(b.clone(), y.clone()) for b, y in make_loader(open_dataset(pixels), 4, num_workers=0, io_depth=0)]
    evict([pixels / "images.npy"])
    loader = make_loader(open_dataset(pixels), 4, num_workers=0, io_depth=3)
    assert loader.sampler.hints.depth == 3 and loader.pixfeed_plan.reasons["io_depth"] == "set by caller"
    got = list(loader)
    assert all((a == b).all() and (x == y).all() for (a, x), (b, y) in zip(got, expected)) and len(got) == len(expected)
    assert make_loader(open_dataset(pixels), 4, io_depth=0).sampler.hints.depth == 0


def test_a_dataset_larger_than_the_page_cache_room_reads_ahead_with_threads(pixels, monkeypatch):
    """WILLNEED is honoured, yet a dataset larger than the page cache this process may keep reads ahead with the
    thread pool by default (a tight cgroup reclaims WILLNEED's pages before they are read); io_depth=0 still
    asks for WILLNEED, and a dataset that fits keeps it."""
    monkeypatch.setattr(depth, "_CHOSEN", {})
    monkeypatch.setattr(depth, "willneed_honoured", lambda p: True)
    nbytes = sum(f.stat().st_size for f in pixels.iterdir())
    monkeypatch.setattr(cacheplan, "page_cache_room", lambda: nbytes // 2)
    plan = make_loader(open_dataset(pixels), 4, num_workers=0).pixfeed_plan
    assert plan.storage == "disk" and plan.io_depth == depth.choose_depth(pixels / "images.npy")[0] >= 1
    assert "larger than the page cache" in plan.reasons["io_depth"] and plan.drop_behind is not None
    assert make_loader(open_dataset(pixels), 4, num_workers=0, io_depth=0).pixfeed_plan.io_depth == 0
    monkeypatch.setattr(cacheplan, "page_cache_room", lambda: nbytes * 100)
    plan = make_loader(open_dataset(pixels), 4, num_workers=0).pixfeed_plan
    assert plan.storage != "disk" and plan.io_depth == 0


def test_pages_are_dropped_behind_what_is_in_flight_and_no_further(pixels, monkeypatch):
    """A dataset larger than the page cache room: the pages of records two batches behind what the loader may
    hold in flight are dropped (workers: prefetch_factor each; in process, the reader thread's 2), or, in
    process without a reader thread, those before the batch being read; a dataset that fits keeps its pages."""
    nbytes = sum(f.stat().st_size for f in pixels.iterdir())
    monkeypatch.setattr(cacheplan, "page_cache_room", lambda: nbytes // 2)
    plan = lambda **kw: make_loader(open_dataset(pixels), 4, io_depth=0, **kw).pixfeed_plan  # noqa: E731
    assert plan(num_workers=0, read_ahead=False).drop_behind == 4
    assert plan(num_workers=0, read_ahead=True).drop_behind == 4 * 4
    assert plan(num_workers=2, prefetch_factor=3).drop_behind == (2 * 3 + 2) * 4
    monkeypatch.setattr(cacheplan, "page_cache_room", lambda: nbytes * 100)
    assert plan(num_workers=0, read_ahead=False).drop_behind is None


def test_quasi_random_order_reads_ahead_with_threads(pixels, monkeypatch):
    """Where WILLNEED is honoured and the dataset fits the page cache, a full shuffle keeps WILLNEED while
    order='quasi_random' reads its runs of records ahead with the thread pool by default; io_depth=0 still
    asks for WILLNEED."""
    monkeypatch.setattr(depth, "_CHOSEN", {})
    monkeypatch.setattr(depth, "willneed_honoured", lambda p: True)
    monkeypatch.setattr(cacheplan, "page_cache_room", lambda: 1 << 40)
    plan = make_loader(open_dataset(pixels), 4, num_workers=0, order="quasi_random").pixfeed_plan
    assert plan.storage != "disk" and plan.order == "quasi_random"
    assert plan.io_depth == depth.choose_depth(pixels / "images.npy")[0] >= 1
    assert plan.reasons["io_depth"].startswith("order='quasi_random'")
    assert make_loader(open_dataset(pixels), 4, num_workers=0).pixfeed_plan.io_depth == 0
    assert make_loader(open_dataset(pixels), 4, num_workers=0, order="quasi_random",
                       io_depth=0).pixfeed_plan.io_depth == 0


def test_io_depth_is_checked(pixels):
    with pytest.raises(OptionError, match="io_depth"):
        make_loader(open_dataset(pixels), 4, io_depth=-1)
    with pytest.raises(OptionError, match="io_depth"):
        make_loader(open_dataset(pixels), 4, io_depth=cacheplan.MAX_IO_DEPTH + 1)
    with pytest.raises(OptionError, match="io_depth=4: there is no read-ahead"):
        make_loader(open_dataset(pixels), 4, io_depth=4, io_ahead=0)
