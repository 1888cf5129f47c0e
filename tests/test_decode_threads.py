"""A batch's images decoded on threads: the same pixels as one thread, errors named, chosen by the plan."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from conftest import make_tree
from pixfeed.image import pool as decodepool
from pixfeed.datasets import open_dataset
from pixfeed.errors import CorruptDataError, OptionError
from pixfeed.loaders import make_loader
from pixfeed.packers import pack


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("threads")
    src = make_tree(root / "src", per_class=8)  # 24 images, JPEG and PNG, several modes
    pack(src, root / "encoded", "mmap", store="encoded", workers=1)
    pack(src, root / "pixels", "mmap", store="pixels", size=16, workers=1)
    return root


def images(loader):
    return torch.cat([x for x, _ in loader])


@pytest.mark.parametrize("crop", ["center", "random"])
def test_threads_decode_the_same_pixels_as_one_thread(packs, crop):
    dataset = open_dataset(packs / "encoded", size=20, crop=crop)
    one = make_loader(dataset, 8, shuffle=True, seed=1, num_workers=0, decode_threads=1)
    three = make_loader(dataset, 8, shuffle=True, seed=1, num_workers=0, decode_threads=3)
    assert three.pixfeed_plan.decode_threads == 3 and one.pixfeed_plan.decode_threads == 1
    assert torch.equal(images(one), images(three))
    indices = list(range(24))
    torch.manual_seed(7)  # outside a loader a random crop draws from torch's RNG, in index order
    threaded = dataset.get_batch(indices, threads=4)[0]
    torch.manual_seed(7)
    assert torch.equal(threaded, dataset.get_batch(indices)[0])


def test_decode_runs_on_the_pool_threads(packs, monkeypatch):
    seen = set()
    dataset = open_dataset(packs / "encoded", size=20)
    pixels = type(dataset).pixels
    monkeypatch.setattr(type(dataset), "pixels",
                        lambda self, *a: seen.add(threading.current_thread().name) or pixels(self, *a))
    dataset.get_batch(list(range(24)), threads=2)
    assert seen and all(name.startswith("pixfeed-decode") for name in seen)


def test_a_damaged_record_is_named_from_a_decode_thread(packs, tmp_path):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in (packs / "encoded").iterdir():
        if f.is_file():
            (damaged / f.name).write_bytes(f.read_bytes())
    offsets = np.load(damaged / "offsets.npy")
    with open(damaged / "data.bin", "r+b") as f:  # one byte of record 5's middle
        f.seek(int(offsets[5] + offsets[6]) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    dataset = open_dataset(damaged, size=20)
    with pytest.raises(CorruptDataError, match="record 5"):
        dataset.get_batch(list(range(10)), threads=3)


def test_the_plan_chooses_threads_only_without_workers(packs):
    encoded = open_dataset(packs / "encoded", size=20)
    in_process = make_loader(encoded, 8, num_workers=0).pixfeed_plan
    assert in_process.decode_threads == in_process.cpus or in_process.cpus < 2
    assert "threads in this process" in in_process.reasons["decode_threads"] or in_process.cpus < 2
    workers = make_loader(encoded, 8, num_workers=2).pixfeed_plan
    assert workers.decode_threads == 1 and "workers" in workers.reasons["decode_threads"]
    pixels = make_loader(open_dataset(packs / "pixels"), 8).pixfeed_plan
    assert pixels.decode_threads == 1 and "no per-image decoding" in pixels.reasons["decode_threads"]
    assert "decode_threads" in str(in_process)


def test_decode_threads_refused_where_nothing_decodes(packs):
    with pytest.raises(OptionError, match="decode_threads=2: applies to"):
        make_loader(open_dataset(packs / "pixels"), 8, decode_threads=2)
    with pytest.raises(OptionError, match="decode_threads"):
        make_loader(open_dataset(packs / "encoded", size=20), 8, decode_threads=0)


def test_the_pool_is_made_again_after_fork():
    from pixfeed.packers.forkpool import imap_unordered

    decodepool.run(lambda j: None, 4, 2)  # the parent's pool has threads; a fork copies none of them
    parent = id(decodepool.pool(2))
    children = list(imap_unordered(lambda _: _pool_in_child(), range(2), 2))
    assert all(child != parent for child in children)


def _pool_in_child() -> int:
    out = []
    decodepool.run(out.append, 4, 2)  # on the parent's pool (no threads here) this would wait for ever
    assert sorted(out) == list(range(4))
    return id(decodepool.pool(2))


def test_tuning_measures_threads_against_workers_and_keeps_a_given_count(packs):
    encoded = open_dataset(packs / "encoded", size=20)
    tuned = make_loader(encoded, 8, num_workers="tune")
    assert any(c.num_workers == 0 for c in tuned.pixfeed_tuning.candidates)  # in process: decoded on threads
    assert tuned.pixfeed_plan.decode_threads == (1 if tuned.num_workers else tuned.pixfeed_plan.cpus)
    assert make_loader(encoded, 8, num_workers="tune", decode_threads=3).pixfeed_plan.decode_threads == 3
