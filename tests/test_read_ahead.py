"""Read-ahead in the sampler's order, the quasi-random order, record extents (LMDB's and HDF5's extents.npy
written by their packers, or looked up in packs made before it), and where epochs come from."""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import make_tree
from pixfeed.checksum import file_hash
from pixfeed.machine import memory
from pixfeed.datasets import open_dataset
from pixfeed.datasets.lmdb import LOOKUPS
from pixfeed.diagnose.storage import check_cache
from pixfeed.errors import CorruptDataError, OptionError
from pixfeed.loaders import cacheplan, epochplan, make_loader, readahead
from pixfeed.loaders.order import quasi_random
from pixfeed.loaders.sampler import ResumableSampler
from pixfeed.packers import pack
from pixfeed.storage.pagecache import Extents, will_need
from pixfeed.machine.world import World
from pixfeed.verify.check import verify

FORMATS = [(f, s) for f in ("mmap", "lmdb", "hdf5") for s in ("pixels", "encoded")]
SINGLE_WRITER = FORMATS[2:]  # LMDB and HDF5: extents.npy
NAME = "extents.npy"


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
    lmdb = open_dataset(packs / "lmdb-pixels")
    assert lmdb.record_extents().lookups == 1  # its extents.npy gives them: nothing looked up
    lmdb.manifest = {**lmdb.manifest, "files": {k: v for k, v in lmdb.manifest["files"].items() if k != "extents.npy"}}
    assert lmdb.record_extents().lookups > 1  # a pack made before extents.npy


# ---- extents.npy: LMDB's and HDF5's record extents written by the packer ----


def lookups(dataset) -> tuple:
    """Every record's (starts, lengths) as a pack without extents.npy finds them: asked of LMDB or HDF5."""
    every = np.arange(len(dataset))
    return dataset._value_ranges(every) if dataset.format == "lmdb" else dataset._record_ranges(every)


def refile(root, name: str) -> None:
    """Record ``name``'s size and hash in the manifest as they are now (or drop its entry when it is gone)."""
    m = json.loads((root / "pixfeed.json").read_text())
    if (root / name).exists():
        m["files"][name] = {"bytes": (root / name).stat().st_size, "xxh3_64": file_hash(root / name)}
    else:
        del m["files"][name]
    (root / "pixfeed.json").write_text(json.dumps(m))


def older(packs, tmp_path, fmt: str, store: str):
    """A copy of a pack as made before extents.npy: the file and its manifest entry gone."""
    root = tmp_path / "old"
    shutil.copytree(packs / f"{fmt}-{store}", root)
    (root / NAME).unlink()
    refile(root, NAME)
    return root


@pytest.fixture
def cold(monkeypatch):
    """Every epoch reads ahead: the page cache said to hold none of the dataset's pages."""
    monkeypatch.setattr(epochplan, "resident_fraction", lambda files, runs=None: 0.0)


def assert_same_ranges(fmt, store, got, want):
    assert np.array_equal(got[0], want[0]), (fmt, store)
    if fmt == "hdf5" and store == "encoded":  # a heap collection: sized for every record in it, not a window's
        assert (got[1] >= want[1]).all() and (want[1] > 0).all()
    else:
        assert np.array_equal(got[1], want[1]), (fmt, store)


@pytest.mark.parametrize("fmt,store", SINGLE_WRITER)
def test_a_fresh_pack_lists_extents_equal_to_the_lookups(packs, monkeypatch, fmt, store):
    root = packs / f"{fmt}-{store}"
    manifest = json.loads((root / "pixfeed.json").read_text())
    assert manifest["files"][NAME]["xxh3_64"] == file_hash(root / NAME)
    table = np.load(root / NAME, mmap_mode="r", allow_pickle=False)
    dataset = open_dataset(root)
    assert table.dtype == np.dtype("<i8") and table.shape == (len(dataset), 2)
    want = lookups(dataset)
    assert_same_ranges(fmt, store, (table[:, 0], table[:, 1]), want)
    cls = type(dataset)
    for name in ("_value_ranges", "_record_ranges"):  # read-ahead asks the file, never the library
        if hasattr(cls, name):
            monkeypatch.setattr(cls, name, lambda self, records: pytest.fail("looked up"))
    extents = dataset.record_extents()
    assert extents.lookups == 1
    window = np.random.default_rng(2).permutation(len(dataset))[:9]
    starts, lengths = extents.of(window)
    assert starts.dtype == lengths.dtype == np.int64
    assert_same_ranges(fmt, store, (starts, lengths), (want[0][window], want[1][window]))


@pytest.mark.parametrize("fmt,store", SINGLE_WRITER)
def test_an_older_pack_without_the_file_reads_ahead_by_lookups(packs, tmp_path, monkeypatch, cold, fmt, store):
    root = older(packs, tmp_path, fmt, store)
    dataset = open_dataset(root)
    cls, asked = type(dataset), []
    name = "_value_ranges" if fmt == "lmdb" else "_record_ranges"
    looked_up = getattr(cls, name)
    monkeypatch.setattr(cls, name, lambda self, records: asked.append(len(records)) or looked_up(self, records))
    extents = dataset.record_extents()
    assert extents.lookups == (LOOKUPS if fmt == "lmdb" else 1)
    fresh = open_dataset(packs / f"{fmt}-{store}").record_extents()
    assert_same_ranges(fmt, store, (fresh.starts, fresh.lengths), (extents.starts, extents.lengths))
    assert asked
    asked.clear()
    loader = make_loader(open_dataset(root, size=16), 4, num_workers=0, io_ahead=1 << 20)
    seen = torch.cat([labels for _, labels in loader])
    assert loader.pixfeed_plan.hints is True and asked  # the epoch's read-ahead looked its records up
    assert sorted(seen.tolist()) == sorted(dataset.read_labels(np.arange(len(dataset))).tolist())


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
@pytest.mark.parametrize("damage", ["rows", "float", "pickle", "truncated", "missing"])
def test_a_damaged_extents_file_is_a_named_error(packs, tmp_path, fmt, damage):
    root = tmp_path / "ds"
    shutil.copytree(packs / f"{fmt}-pixels", root)
    table = np.load(root / NAME)
    if damage == "rows":
        np.save(root / NAME, table[:-1])
    elif damage == "float":
        np.save(root / NAME, table.astype(np.float64))
    elif damage == "pickle":
        np.save(root / NAME, np.array([{"start": 0}] * len(table), dtype=object), allow_pickle=True)
    elif damage == "truncated":
        (root / NAME).write_bytes((root / NAME).read_bytes()[:100])
    else:
        (root / NAME).unlink()
    if damage != "missing":
        refile(root, NAME)  # the damage is the pack's own, not a size the file check names at open
        with pytest.raises(CorruptDataError, match=f"{root / NAME}.*damaged"):
            open_dataset(root).record_extents()
    else:
        with pytest.raises(Exception, match=NAME):
            open_dataset(root).record_extents()
    problems = verify(root).problems
    assert any(NAME in p for p in problems), problems


def test_verify_names_a_changed_byte_of_the_extents_file(packs, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(packs / "lmdb-pixels", root)
    assert verify(root).problems == []
    data = bytearray((root / NAME).read_bytes())
    data[-3] ^= 0x40
    (root / NAME).write_bytes(data)
    problems = verify(root).problems
    assert len(problems) == 1 and NAME in problems[0] and "does not match" in problems[0]


@pytest.mark.parametrize("fmt,store", SINGLE_WRITER)
def test_wrong_ranges_are_advice_and_never_change_what_is_read(packs, tmp_path, cold, fmt, store):
    """Ranges pointing anywhere (past the end, negative, swapped between records) change no pixel or label:
    the readers read through LMDB and h5py and check checksums; the hints are clipped to the data file."""
    root = tmp_path / "ds"
    shutil.copytree(packs / f"{fmt}-{store}", root)
    size = 16 if store == "pixels" else 24

    def epoch(path):
        loader = make_loader(open_dataset(path, size=size), 4, shuffle=False, num_workers=0, io_ahead=1 << 20)
        batches = [(images.clone(), labels.clone()) for images, labels in loader]
        assert loader.pixfeed_plan.hints is True
        return batches

    want = epoch(packs / f"{fmt}-{store}")
    table = np.load(root / NAME)
    table[::3, 0] = -(1 << 40)
    table[1::3, 1] = 1 << 62
    table[2::3] = table[2::3][::-1]
    np.save(root / NAME, table)
    refile(root, NAME)
    starts, lengths = open_dataset(root).record_extents().of(np.arange(len(table)))
    data = (root / ("data.mdb" if fmt == "lmdb" else "data.h5")).stat().st_size
    assert (starts >= 0).all() and (lengths >= 0).all() and (starts + lengths <= data).all()
    got = epoch(root)
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.parametrize("fmt,store", SINGLE_WRITER)
def test_a_repack_writes_its_own_extents(packs, tmp_path, fmt, store):
    """Repacked LMDB <-> HDF5 (another format, the records at other places): the new file's own ranges."""
    other = "hdf5" if fmt == "lmdb" else "lmdb"
    pack(packs / f"{fmt}-{store}", tmp_path / "new", other, workers=1)
    dataset = open_dataset(tmp_path / "new")
    assert dataset.store == store and NAME in dataset.manifest["files"]
    extents = dataset.record_extents()
    assert_same_ranges(other, store, (extents.starts, extents.lengths), lookups(dataset))
    again = tmp_path / "again"
    pack(tmp_path / "new", again, fmt, workers=1)  # and back: the same ranges as the first pack's
    table, first = np.load(again / NAME), np.load(packs / f"{fmt}-{store}" / NAME)
    assert_same_ranges(fmt, store, (table[:, 0], table[:, 1]), lookups(open_dataset(again)))
    assert table.shape == first.shape


def test_hdf5_extents_are_found_without_chunk_iter(packs):
    """h5py built on HDF5 before 1.12.3 has no chunk_iter: every_extent asks the chunks one by one, to the same
    ranges, and needs nothing else."""
    from types import SimpleNamespace

    from pixfeed.datasets.hdf5 import every_extent

    class Older:  # the dataset's id without chunk_iter
        def __init__(self, dsid):
            self.dsid = dsid

        def __getattr__(self, name):
            if name == "chunk_iter":
                raise AttributeError(name)
            return getattr(self.dsid, name)

    # the dataset's own handle, as the packer's writer handle: data.h5 opened once
    data = open_dataset(packs / "hdf5-pixels").handle["data"]
    older = SimpleNamespace(id=Older(data.id), chunks=data.chunks, shape=data.shape, ndim=data.ndim)
    got = np.stack(every_extent(older), 1)
    assert np.array_equal(got, np.load(packs / "hdf5-pixels" / NAME)) and (got[:, 1] > 0).all()


def test_a_compressed_hdf5_pack_has_no_extents_file(packs, tmp_path):
    """HDF5 reads a compressed chunk whole and decompresses it: no read-ahead (as before), so no file."""
    pack(packs / "src", tmp_path / "lzf", "hdf5", store="pixels", size=16, compression="lzf", workers=1)
    dataset = open_dataset(tmp_path / "lzf")
    assert NAME not in dataset.manifest["files"] and not (tmp_path / "lzf" / NAME).exists()
    assert dataset.record_extents() is None


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_pack_into_a_bucket_uploads_the_extents(packs, s3_server, fmt):
    url = f"s3://pixfeed/extentfile-{fmt}"
    manifest = pack(packs / "src", url, fmt, store="encoded", workers=1, storage_options=s3_server.options,
                    overwrite=True)
    assert NAME in manifest["files"]
    dataset = open_dataset(url, storage_options=s3_server.options)
    assert verify(url, storage_options=s3_server.options).problems == []
    extents = dataset.record_extents()
    assert_same_ranges(fmt, "encoded", (extents.starts, extents.lengths), lookups(dataset))
