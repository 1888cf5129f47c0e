"""Read-ahead in the sampler's order, the quasi-random order, record extents, and where epochs come from."""
from __future__ import annotations

import os
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import make_tree
from pixfeed.machine import memory
from pixfeed.datasets import open_dataset
from pixfeed.diagnose.storage import check_cache
from pixfeed.errors import CorruptDataError, OptionError
from pixfeed.loaders import cacheplan, make_loader, readahead
from pixfeed.loaders.order import quasi_random
from pixfeed.loaders.sampler import ResumableSampler
from pixfeed.packers import pack
from pixfeed.storage.pagecache import Extents, will_need
from pixfeed.machine.world import World

FORMATS = [(f, s) for f in ("mmap", "lmdb", "hdf5") for s in ("pixels", "encoded")]


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("extents")
    src = make_tree(root / "src", per_class=5)
    for fmt, store in FORMATS:
        pack(src, root / f"{fmt}-{store}", fmt, store=store, **({"size": 16} if store == "pixels" else {}), workers=1)
    return root


@pytest.mark.parametrize("fmt,store", FORMATS)
def test_every_record_lies_inside_its_extent(packs, fmt, store):
    dataset = open_dataset(packs / f"{fmt}-{store}")
    extents = dataset.record_extents()
    data = extents.path.read_bytes()
    _, stored, _ = dataset.read_checked(range(len(dataset)))
    for i, record in enumerate(stored):
        span = data[extents.starts[i]:extents.starts[i] + extents.lengths[i]]
        assert np.asarray(record).tobytes() in span, (fmt, store, i)
    if fmt != "hdf5" or store == "pixels":  # the heap collection of an encoded HDF5 record may hold others
        assert extents.lengths.sum() < 1.2 * sum(len(np.asarray(r).tobytes()) for r in stored) + 48 * len(stored)


@pytest.mark.parametrize("fmt,store", FORMATS)
def test_extents_of_a_window_of_the_order_are_those_of_its_records(packs, fmt, store):
    """Read-ahead asks for the byte ranges of a window of the order at a time (nothing per record kept):
    they are the records' own, in the window's order."""
    extents = open_dataset(packs / f"{fmt}-{store}").record_extents()
    whole_starts, whole_lengths = extents.starts, extents.lengths
    window = np.random.default_rng(1).permutation(len(whole_starts))[:7].astype(np.int32)
    starts, lengths = extents.of(window)
    assert starts.dtype == lengths.dtype == np.int64
    assert np.array_equal(starts, whole_starts[window]), (fmt, store)
    if fmt != "hdf5" or store == "pixels":  # an encoded HDF5 record's heap collection: from its chunk's records
        assert np.array_equal(lengths, whole_lengths[window]), (fmt, store)
    else:
        assert (lengths > 0).all() and (lengths <= whole_lengths[window]).all()


@pytest.mark.parametrize("store", ["pixels", "encoded"])
@pytest.mark.parametrize("fits", [True, False])
def test_mmap_checks_each_record_mapped_or_read(packs, tmp_path, monkeypatch, store, fits):
    import shutil

    from pixfeed.datasets import mmap as reader

    monkeypatch.setattr(reader, "fits_in_page_cache", lambda nbytes: fits)
    shutil.copytree(packs / f"mmap-{store}", tmp_path / "ds")
    dataset = open_dataset(tmp_path / "ds")
    extents = dataset.record_extents()
    with open(extents.path, "r+b") as f:  # flip a byte of record 2
        f.seek(int(extents.starts[2]) + 5)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptDataError, match="record 2 .*checksum"):
        dataset.read_checked([0, 1, 2, 3])
    dataset.read_stored(np.array([2]))  # unchecked by contract
    open_dataset(tmp_path / "ds", checksums=False).read_checked([2])
    assert ("map" in dataset.handle) == fits
    if fits:
        return  # a mapped file must not shrink under its reader (SIGBUS); check_files guards the open
    last = len(dataset) - 1
    os.truncate(extents.path, int(extents.starts[last]) + 1)  # after the file was opened at full size
    with pytest.raises(CorruptDataError, match=f"record {last} .*truncated"):
        dataset.read_checked([last])


@pytest.mark.parametrize("fits", [True, False])
@pytest.mark.parametrize("size", [12, 16])
def test_mmap_crops_are_read_whole_checked(packs, tmp_path, monkeypatch, fits, size):
    """get_batch writes each record's crop into the batch in one pass, yet hashes the whole record: a byte
    flipped outside the crop (the first row, which a center crop of 12 from 16 leaves out) still fails it."""
    import shutil

    from pixfeed.datasets import mmap as reader

    monkeypatch.setattr(reader, "fits_in_page_cache", lambda nbytes: fits)
    shutil.copytree(packs / "mmap-pixels", tmp_path / "ds")
    stored = np.load(tmp_path / "ds" / "images.npy")
    order = [3, 0, 7, 3, 5]
    dataset = open_dataset(tmp_path / "ds", size=size)
    lo = (16 - size) // 2
    expected = stored[order][:, lo:lo + size, lo:lo + size]
    images, labels = dataset.get_batch(order)
    assert np.array_equal(images.permute(0, 2, 3, 1).numpy(), expected)
    assert labels.tolist() == [int(dataset[i][1]) for i in order]
    out = np.zeros((len(order), size, size, 3), np.uint8)  # a mixture's rows of its batch
    dataset.get_batch(order, out=out)
    assert np.array_equal(out, expected)
    extents = dataset.record_extents()
    with open(extents.path, "r+b") as f:  # record 5's first byte: outside any center crop smaller than 16
        f.seek(int(extents.starts[5]))
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptDataError, match="record 5 .*checksum"):
        dataset.get_batch(order)
    unchecked = open_dataset(tmp_path / "ds", size=size, checksums=False).get_batch(order)[0]
    if size < 16:  # the flipped byte is not in the crop
        assert np.array_equal(unchecked.permute(0, 2, 3, 1).numpy(), expected)
    else:
        assert not np.array_equal(unchecked.permute(0, 2, 3, 1).numpy(), expected)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, fd, starts, lengths):
        self.calls.append((starts.copy(), lengths.copy()))


def test_hints_stay_within_the_budget_and_run_ahead_of_the_reader(monkeypatch):
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 1000, 500)
    extents = Extents(__file__, np.r_[0, np.cumsum(lengths)[:-1]], lengths)
    recorder = Recorder()
    monkeypatch.setattr(readahead, "will_need", recorder)
    order = rng.permutation(500).tolist()
    budget = 50_000
    hinted = lambda: [s for starts, _ in list(recorder.calls) for s in starts]  # noqa: E731
    seen = []
    for pos, index in enumerate(readahead.Hinter(extents, budget).follow(order)):
        seen.append(index)
        ahead = hinted()
        assert sum(int(lengths[i]) for i in order[pos:len(ahead)]) <= budget + lengths.max()  # bounded
        assert sorted(ahead) == sorted(extents.starts[order[:len(ahead)]])  # in the order's sequence
        if pos % 50 == 0:  # the thread catches up with the reader and requests what comes next
            deadline = time.monotonic() + 5
            while len(hinted()) < min(500, pos + 20) and time.monotonic() < deadline:
                time.sleep(0.001)
            assert len(hinted()) >= min(500, pos + 20)
    assert seen == order
    assert sorted(hinted()) == sorted(extents.starts.tolist())  # each record requested once
    assert len(recorder.calls) < 500 / 4  # topped up in steps, not one call per record


def test_will_need_requests_in_file_order_and_merges_touching_ranges(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: calls.append((offset, length, advice)))
    will_need(-1, np.array([30, 10, 0, 5, 60]), np.array([10, 10, 10, 3, 1]))
    assert calls == [(0, 20, os.POSIX_FADV_WILLNEED), (30, 10, os.POSIX_FADV_WILLNEED), (60, 1, os.POSIX_FADV_WILLNEED)]


@given(st.integers(1, 300), st.integers(1, 40), st.integers(1, 120), st.integers(0, 10))
@settings(max_examples=60, deadline=None)
def test_quasi_random_is_a_permutation_of_chunks_shuffled_within_windows(n, chunk, window, seed):
    order = quasi_random(n, chunk, window, torch.Generator().manual_seed(seed)).tolist()
    assert sorted(order) == list(range(n))
    assert order == quasi_random(n, chunk, window, torch.Generator().manual_seed(seed)).tolist()
    for start in range(0, n, window):
        chunks = {i // chunk for i in order[start:start + window]}
        assert len(chunks) <= -(-window // chunk) + 2  # a few whole chunks (one may be the short last one)


def test_quasi_random_mixes_the_dataset():
    order = quasi_random(10_000, 10, 1000, torch.Generator().manual_seed(0)).tolist()
    assert order != sorted(order)
    first_window = order[:1000]
    assert np.ptp(first_window) > 5000  # its chunks come from all over the dataset
    assert order[:1000] != quasi_random(10_000, 10, 1000, torch.Generator().manual_seed(1))[:1000].tolist()


@pytest.mark.parametrize("world,drop_last", [(1, False), (3, False), (3, True)])
def test_quasi_random_sampler_splits_ranks_evenly_and_resumes(world, drop_last):
    data = list(range(100))

    def sampler(rank, start=0, epoch=2):
        s = ResumableSampler(data, distributed=False, shuffle=True, seed=5, drop_last=drop_last)
        s.quasi, s.offset = (4, 20), start
        s.use(World(rank, world))
        s.start(epoch)
        return list(s)

    ranks = [sampler(r) for r in range(world)]
    assert len({len(r) for r in ranks}) == 1
    counts = Counter(i for r in ranks for i in r)
    assert set(counts) <= set(data) and (drop_last or set(counts) == set(data))
    assert sum(counts.values()) - len(counts) < world  # only the padding repeats
    half = [sampler(r, start=30 * world) for r in range(world)]
    assert all(h == r[30:] for h, r in zip(half, ranks))  # part-way: the rest of the same order
    assert sampler(0, epoch=3) != ranks[0]


def test_loader_reads_every_record_once_in_quasi_random_order(packs):
    dataset = open_dataset(packs / "mmap-pixels")
    loader = make_loader(dataset, 4, order="quasi_random", io_ahead=1 << 20, seed=3)
    assert loader.pixfeed_plan.order == "quasi_random" and loader.pixfeed_plan.io_ahead == 1 << 20
    assert loader.sampler.quasi is not None and loader.sampler.hints is not None
    labels = torch.cat([y for _, y in loader])
    assert sorted(labels.tolist()) == sorted(np.asarray(dataset.read_stored(np.arange(len(dataset)))[1]).tolist())
    state = loader.state_dict()
    assert state["order"] == list(loader.sampler.quasi)
    with pytest.raises(OptionError, match="order='quasi_random'"):
        make_loader(dataset, 4, seed=3).load_state_dict(state)


def test_order_and_io_ahead_options_are_checked(packs):
    dataset = open_dataset(packs / "mmap-pixels")
    with pytest.raises(OptionError, match="order='sorted'"):
        make_loader(dataset, 4, order="sorted")
    with pytest.raises(OptionError, match="shuffle=False"):
        make_loader(dataset, 4, order="quasi_random", shuffle=False)
    with pytest.raises(OptionError, match="io_ahead"):
        make_loader(dataset, 4, io_ahead=-1)
    loader = make_loader(dataset, 4, io_ahead=0)
    assert loader.sampler.hints is None and loader.pixfeed_plan.reasons["io_ahead"] == "set by caller"
    with pytest.raises(OptionError, match="quasi_random"):
        make_loader(dataset, 4, io_ahead=0, order="quasi_random")


def test_plan_says_where_epochs_come_from(packs, monkeypatch):
    dataset = open_dataset(packs / "mmap-pixels")
    nbytes = cacheplan.dataset_bytes(dataset)
    monkeypatch.setattr(cacheplan, "page_cache_room", lambda: 10 * nbytes)
    plan = make_loader(dataset, 4).pixfeed_plan
    assert plan.storage == "page cache" and "page cache" in str(plan)
    monkeypatch.setattr(cacheplan, "page_cache_room", lambda: nbytes // 2)
    plan = make_loader(dataset, 4).pixfeed_plan
    assert plan.storage == "disk" and "quasi_random" in plan.reasons["storage"]
    assert plan.io_ahead == cacheplan.MIN_IO_AHEAD  # 1/8 of a tiny room, at least 1 MiB
    assert check_cache(packs / "mmap-pixels", nbytes // 2).data["served_from"] == "disk"
    assert check_cache(packs / "mmap-pixels", 10 * nbytes).status == "ok"


def test_page_cache_room_is_the_smallest_of_host_and_every_cgroup_level(tmp_path):
    (tmp_path / "proc").write_text("4:memory:/job/step\n0::/\n")
    for rel, limit, usage, cache in (("", 2**63, 0, 0), ("job", 8 << 30, 5 << 30, 4 << 30),
                                     ("job/step", 4 << 30, 1 << 30, 0)):
        d = tmp_path / "cg" / "memory" / rel
        d.mkdir(parents=True, exist_ok=True)
        (d / "memory.limit_in_bytes").write_text(str(limit))
        (d / "memory.usage_in_bytes").write_text(str(usage))
        (d / "memory.stat").write_text(f"cache {cache}\nrss {usage - cache}\n")
    (tmp_path / "meminfo").write_text("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")
    dirs = memory.own_cgroups(tmp_path / "proc", tmp_path / "cg")
    assert dirs == [tmp_path / "cg/memory/job/step", tmp_path / "cg/memory/job", tmp_path / "cg/memory"]
    room = memory.page_cache_room(tmp_path / "proc", tmp_path / "cg", tmp_path / "meminfo")
    assert room == 3 << 30  # step: 4 GiB - 1 GiB of non-cache use; job: 8 - (5 - 4) = 7 GiB; host 32 GiB


def test_a_record_whose_range_cannot_be_found_stops_the_hints_not_the_reading(monkeypatch):
    """Looking up a window's byte ranges can fail (an LMDB key missing): the hint thread stops quietly and
    every index is still handed out, for the reader to name the damage as it reads it."""
    from pixfeed.errors import CorruptDataError

    def ranges(records):
        if (np.asarray(records) >= 30).any():
            raise CorruptDataError("record 30: key missing")
        return np.asarray(records, np.int64) * 10, np.full(len(records), 10, np.int64)

    recorder = Recorder()
    monkeypatch.setattr(readahead, "will_need", recorder)
    failures = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    extents = Extents(__file__, whole=[], ranges=ranges, count=100, mean_length=10.0)
    assert list(readahead.Hinter(extents, 100).follow(np.arange(100))) == list(range(100))
    assert not failures


def test_extents_looked_up_record_by_record_are_looked_up_in_parallel_parts(packs):
    """An LMDB lookup in a cold file waits for a page of the value (37 MB/s for a cold shuffled epoch when
    made one by one): ``lookups`` parts of a window are looked up at once, the results in the window's order."""
    barrier = threading.Barrier(4, timeout=10)

    def ranges(records):
        barrier.wait()  # returns only when 4 parts are being looked up at once
        return np.asarray(records, np.int64) * 10, np.full(len(records), 10, np.int64)

    extents = Extents(__file__, whole=[], ranges=ranges, count=100, mean_length=10.0)
    extents.lookups = 4
    window = np.random.default_rng(2).permutation(100)[:40]
    starts, lengths = extents.of(window)
    assert np.array_equal(starts, window * 10) and np.array_equal(lengths, np.full(40, 10))
    assert open_dataset(packs / "lmdb-pixels").record_extents().lookups > 1
