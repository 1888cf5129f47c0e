"""What each epoch turns on or off (read-ahead hints, the reader thread) and how random crops are seeded."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_tree
from pixfeed.storage import pagecache
from pixfeed.datasets import open_dataset
from pixfeed.loaders import epochplan, make_loader
from pixfeed.loaders.seeding import BATCH, INDEX, NONE
from pixfeed.packers import pack


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("epochplan")
    src = make_tree(root / "src", per_class=6)  # 18 images
    pack(src, root / "pixels", "mmap", store="pixels", size=32, workers=1)
    pack(src, root / "encoded", "lmdb", store="encoded", workers=1)
    return root


def files(path: Path):
    return [p for p in path.iterdir() if p.is_file()]


def evicted_copy(src: Path, dst: Path) -> Path:
    """A copy of dataset ``src`` with none of its pages in the page cache (skips where that cannot be)."""
    dst.mkdir()
    for f in files(src):
        (dst / f.name).write_bytes(f.read_bytes())
    pagecache.evict(files(dst))
    if pagecache.resident_fraction(files(dst)) != 0.0:
        pytest.skip("this file system keeps evicted pages (tmpfs or overlay): nothing to read ahead")
    return dst


def reader_threads():
    return {t for t in threading.enumerate() if t.name == "pixfeed-reader"}


def first_epoch(loader):
    """Start an epoch and read one batch; the epoch's decisions are then in the plan."""
    batches = iter(loader)
    next(batches)
    return batches


@pytest.mark.parametrize("store", ["pixels", "encoded"])
def test_a_warm_local_dataset_is_read_without_hints_or_reader_thread(packs, store):
    dataset = open_dataset(packs / store, size=16)
    loader = make_loader(dataset, 4, num_workers=0)
    list(loader)  # every page read: warm
    before = reader_threads()
    batches = first_epoch(loader)
    plan = loader.pixfeed_plan
    assert plan.hints is False and "nothing to read ahead" in plan.reasons["hints"]
    assert plan.reader_thread is False and "cannot wait on storage" in plan.reasons["reader_thread"]
    assert reader_threads() <= before
    del batches
    assert "hints" in str(plan) and "reader_thread" in str(plan)


def test_an_evicted_dataset_gets_hints_and_a_bounded_reader(packs, tmp_path):
    path = evicted_copy(packs / "pixels", tmp_path / "copy")
    loader = make_loader(open_dataset(path), 4, num_workers=0)
    before = reader_threads()
    batches = first_epoch(loader)
    plan = loader.pixfeed_plan
    assert plan.hints is True and "page cache" in plan.reasons["hints"]
    assert plan.reader_thread is True and "stall_timeout bounds the wait" in plan.reasons["reader_thread"]
    assert reader_threads() - before
    del batches


def test_reads_that_may_block_keep_the_reader_thread(packs, monkeypatch):
    dataset = open_dataset(packs / "pixels")
    list(make_loader(dataset, 4, num_workers=0))
    monkeypatch.setattr(epochplan, "file_system", lambda path: "nfs4")
    loader = make_loader(dataset, 4, num_workers=0)
    first_epoch(loader)
    assert loader.pixfeed_plan.reader_thread is True
    assert "nfs4 file system" in loader.pixfeed_plan.reasons["reader_thread"]
    transformed = open_dataset(packs / "pixels", transform=lambda t: t.float())
    loader = make_loader(transformed, 4, num_workers=0)
    first_epoch(loader)
    assert "a transform runs code" in loader.pixfeed_plan.reasons["reader_thread"]


def test_workers_need_no_reader_thread(packs):
    loader = make_loader(open_dataset(packs / "encoded", size=16), 4, num_workers=1)
    first_epoch(loader)
    assert loader.pixfeed_plan.reader_thread is False and "workers" in loader.pixfeed_plan.reasons["reader_thread"]


def test_sampled_residency_agrees_with_every_page(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(np.random.default_rng(0).bytes(4 << 20))  # 1,024 pages: sampled with 4 runs of 16
    path.read_bytes()
    assert pagecache.resident_fraction([path], windows=4) == pagecache.resident_fraction([path]) == 1.0
    pagecache.evict([path])
    full = pagecache.resident_fraction([path])
    if full != 0.0:
        pytest.skip("this file system keeps evicted pages")
    assert pagecache.resident_fraction([path], windows=4) == 0.0
    with open(path, "rb") as f:  # the last page only: a run ends at the end of the file
        f.seek((4 << 20) - 10)
        f.read()
    assert 0.0 < pagecache.resident_fraction([path], windows=4) <= 2 / 64


def crops_of(loader):
    return torch.cat([images for images, _ in loader])


@pytest.mark.parametrize("store", ["pixels", "encoded"])
def test_random_crops_are_read_a_batch_at_a_time_and_depend_on_the_sample_alone(packs, store, monkeypatch):
    dataset = open_dataset(packs / store, size=16, crop="random")
    calls = []
    read = type(dataset).get_batch
    monkeypatch.setattr(type(dataset), "get_batch", lambda self, idx: calls.append(len(idx)) or read(self, idx))
    loader = make_loader(dataset, 4, shuffle=False, num_workers=0, seed=3)
    assert loader.pixfeed_plan.seeding == INDEX
    crops = crops_of(loader)
    assert calls == [4, 4, 4, 4, 2]  # one read per batch, not one per sample
    by_six = crops_of(make_loader(dataset, 6, shuffle=False, num_workers=0, seed=3))
    assert torch.equal(crops, by_six)  # the same crop for a sample whatever batch it is read in
    two_workers = crops_of(make_loader(dataset, 4, shuffle=False, num_workers=2, seed=3))
    assert torch.equal(crops, two_workers)
    second_epoch = crops_of(loader)
    assert not torch.equal(crops, second_epoch)
    assert not torch.equal(crops, crops_of(make_loader(dataset, 4, shuffle=False, num_workers=0, seed=4)))
    assert len({bytes(c.numpy()) for c in crops}) == len(crops)


def test_seeding_follows_what_the_dataset_draws(packs):
    assert make_loader(open_dataset(packs / "pixels"), 4).pixfeed_plan.seeding == NONE
    transformed = open_dataset(packs / "pixels", size=16, crop="random", transform=lambda t: t)
    assert make_loader(transformed, 4).pixfeed_plan.seeding == "per sample"

    class Queried(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return i

        def __getitems__(self, indices):
            return list(indices)

    assert make_loader(Queried(), 4).pixfeed_plan.seeding == BATCH


def test_lmdb_record_extents_are_looked_up_only_for_an_epoch_that_reads_ahead(packs, tmp_path, monkeypatch):
    """A pack made before extents.npy (the file and its manifest entry gone) looks its records up."""
    old = tmp_path / "old"
    old.mkdir()
    for f in files(packs / "encoded"):
        if f.name != "extents.npy":
            (old / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((old / "pixfeed.json").read_text())
    del manifest["files"]["extents.npy"]
    (old / "pixfeed.json").write_text(json.dumps(manifest))
    walks = []
    cls = type(open_dataset(old))
    walk = cls._value_ranges
    monkeypatch.setattr(cls, "_value_ranges", lambda self, records: walks.append(self.path) or walk(self, records))
    warm = open_dataset(old, size=16)
    list(warm.get_batch(list(range(len(warm)))))  # every record read: warm
    loader = make_loader(warm, 4, num_workers=0)
    assert walks == []  # make_loader itself walks nothing
    list(loader)
    assert loader.pixfeed_plan.hints is False and walks == []
    cold = evicted_copy(old, tmp_path / "cold")
    loader = make_loader(open_dataset(cold, size=16), 4, num_workers=0)
    assert walks == []
    list(loader)
    assert loader.pixfeed_plan.hints is True and set(walks) == {cold}
