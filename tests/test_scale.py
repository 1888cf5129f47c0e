"""Many records, nothing per record in a process's Python heap: the first read opens no key file, an error
still names its record's key (from the memory-mapped key index), the loader's memory does not grow with the
record count, and the sampler's order is the one it always was (the old list-building algorithm, below)."""
from __future__ import annotations

import builtins
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pixfeed.datasets import open_dataset
from pixfeed.errors import CorruptDataError
from pixfeed.loaders.sampler import ResumableSampler
from pixfeed.packers import pack
from pixfeed.machine.world import World

BIG, SMALL, DISTINCT = 200_000, 10_000, 500
PER_RECORD_BOUND = 20  # bytes a record (the bound): a list of Python ints costs at least 36 (a pointer and an int)


def tiny_source(root: Path, records: int) -> Path:
    """``records`` 8x8 JPEGs in 100 class folders, hard links to DISTINCT files."""
    rng = np.random.default_rng(0)
    (root / "blobs").mkdir(parents=True)
    for j in range(DISTINCT):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / "blobs" / f"{j}.jpg")
    for c in range(100):
        (root / "src" / f"c{c:02d}").mkdir(parents=True)
    for i in range(records):
        os.link(root / "blobs" / f"{i % DISTINCT}.jpg", root / "src" / f"c{i % 100:02d}" / f"{i:07d}.jpg")
    return root / "src"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("scale")
    out = {}
    for n in (SMALL, BIG):
        out[n] = root / f"ds{n}"
        pack(tiny_source(root / f"s{n}", n), out[n], "mmap", store="encoded")
    return out


def key_of(i: int, n: int) -> str:
    """Record ``i``'s key: records go class by class (2,000 a class for 200,000), files sorted by name."""
    per_class = n // 100
    c, j = divmod(i, per_class)
    return f"c{c:02d}/{c + 100 * j:07d}"


def test_the_first_read_opens_no_key_file_and_an_error_names_the_key(datasets, monkeypatch):
    path = datasets[BIG]
    opened = []
    real_open, real_os_open = builtins.open, os.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: opened.append(str(f)) or real_open(f, *a, **k))
    monkeypatch.setattr(os, "open", lambda f, *a, **k: opened.append(str(f)) or real_os_open(f, *a, **k))
    ds = open_dataset(path, size=8)
    image, label = ds[123_456]
    assert tuple(image.shape) == (3, 8, 8) and label == 123_456 // (BIG // 100)
    assert not [f for f in opened if Path(f).name.startswith("keys.")], opened
    monkeypatch.undo()
    offsets = np.load(path / "offsets.npy")
    with open(path / "data.bin", "r+b") as f:  # flip a byte of record 150,000
        f.seek(int(offsets[150_000]) + 5)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptDataError, match=rf"record 150000 \(key '{key_of(150_000, BIG)}'\)"):
        open_dataset(path, size=8)[150_000]
    assert open_dataset(path).key(150_001) == key_of(150_001, BIG)


READ = r'''
import json, sys
import pixfeed

def rss_anon(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

loader = pixfeed.make_loader(pixfeed.open_dataset(sys.argv[1], size=8), 64, num_workers=2, persistent_workers=True)
done, it = 0, iter(loader)
workers = []
while done < 100:
    for _ in it:
        done += 1
        if done == 100:
            break
    else:
        it = iter(loader)
import os, pathlib
for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    fields = stat.read_text().rsplit(")", 1)[1].split()
    if int(fields[1]) == os.getpid() and b"python" in (stat.parent / "cmdline").read_bytes():
        workers.append(rss_anon(stat.parent.name))
print(json.dumps({"main": rss_anon("self"), "workers": sorted(workers)}))
'''


def test_loader_memory_does_not_grow_with_the_record_count(datasets):
    """RssAnon of the training process and of each worker after 100 batches, 200,000 records against 10,000:
    within PER_RECORD_BOUND bytes a record (a Python list of the indices would be ~36)."""
    rss = {}
    for n, path in datasets.items():
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}  # freed temporaries go back: live memory
        done = subprocess.run([sys.executable, "-c", READ, str(path)], capture_output=True, text=True, timeout=300,
                              env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        rss[n] = json.loads(done.stdout.splitlines()[-1])
    bound = PER_RECORD_BOUND * (BIG - SMALL)
    assert rss[BIG]["main"] - rss[SMALL]["main"] < bound, rss
    assert len(rss[BIG]["workers"]) == 2
    for big, small in zip(rss[BIG]["workers"], rss[SMALL]["workers"]):
        assert big - small < bound, rss


@pytest.mark.parametrize("io_depth", ["auto", 4])
def test_read_ahead_keeps_nothing_per_record(datasets, monkeypatch, io_depth):
    """A cold epoch read in process with read-ahead on: what the training process allocates (Python and
    NumPy, traced: no RSS noise) grows by less than PER_RECORD_BOUND bytes a record from 10,000 records to
    200,000, the epoch order (a torch permutation, not traced) counted in; it held ~20 bytes a record (the
    order's byte ranges and their running sums) and now only a window of the order.  The same with the
    records ahead read by threads (io_depth=4): their queue holds a top-up's pieces, not the epoch's."""
    import tracemalloc

    from pixfeed.loaders import epochplan, make_loader

    monkeypatch.setattr(epochplan, "resident_fraction", lambda files, runs=None: 0.0)  # cold: hints on
    grown = {}
    for n, path in datasets.items():
        tracemalloc.start()
        try:
            loader = make_loader(open_dataset(path, size=8), 64, num_workers=0, io_ahead=1 << 20, io_depth=io_depth)
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            batches = iter(loader)
            for _ in zip(range(100), batches):
                pass
            assert loader.pixfeed_plan.hints is True
            now, peak = tracemalloc.get_traced_memory()
            del batches
        finally:
            tracemalloc.stop()
        grown[n] = {"held": now - before, "peak": peak - before, "order": loader.sampler.epoch_order().nbytes}
    bound = PER_RECORD_BOUND * (BIG - SMALL)
    for kind in ("held", "peak"):
        growth = grown[BIG][kind] - grown[SMALL][kind] + grown[BIG]["order"] - grown[SMALL]["order"]
        assert growth < bound / 2, grown  # the order's 4 bytes a record and a window: far below the bound


class Records:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def list_order(n, world, rank, offset, drop_last, shuffle, seed, epoch) -> list:
    """The sampler's order as it was built before, as a list of every index."""
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        order = torch.randperm(n, generator=generator).tolist()
    else:
        order = list(range(n))
    left = max(n - offset, 0)
    end = offset + (left // world if drop_last else -(-left // world)) * world
    return [order[p % len(order)] for p in range(offset + rank, end, world)]


def test_the_order_is_the_one_it_always_was():
    for n, world, offset, drop_last, shuffle in itertools.product([1, 7, 33, 1000], [1, 2, 3, 5], [0, 1, 9],
                                                                  [False, True], [False, True]):
        for rank in range(world):
            sampler = ResumableSampler(Records(n), distributed="auto", shuffle=shuffle, seed=3, drop_last=drop_last)
            sampler.set_epoch(2)
            sampler.use(World(rank, world))
            sampler.offset = offset
            got = list(sampler)
            assert got == list_order(n, world, rank, offset, drop_last, shuffle, 3, 2), (n, world, rank, offset)
            assert all(type(i) is int for i in got)


def test_the_key_index_is_opened_once_per_process_and_never_pickled(image_tree, tmp_path, monkeypatch):
    """A key lookup reads one key from the index a dataset opened once (it opened both files for
    every key before: 330 us a lookup); a pickled dataset (a spawned worker) opens its own."""
    import pickle

    pack(image_tree, tmp_path / "ds", "mmap", workers=1)
    from pixfeed import keyindex

    ds, loads, real = open_dataset(tmp_path / "ds"), [], keyindex.map_inside  # maps the file it opened, not a path
    monkeypatch.setattr(keyindex, "map_inside",
                        lambda root, rel, *a: loads.append(Path(rel).name) or real(root, rel, *a))
    keys = [ds.key(i) for i in range(len(ds))] * 2
    assert loads.count("keys.offsets.npy") == 1
    assert keys[:len(ds)] == json.loads((tmp_path / "ds" / "keys.json").read_text())
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._keys is None and clone.key(3) == keys[3] and loads.count("keys.offsets.npy") == 2
    with pytest.raises(IndexError, match=f"record {len(ds)} of {len(ds)}"):
        ds.key(len(ds))
