"""state_dict / load_state_dict: an interrupted epoch resumes with exactly the batches an uninterrupted
run reads, whatever num_workers and prefetch_factor; on another world size nothing is lost or repeated."""
from __future__ import annotations

import json
from collections import Counter
from typing import List, Tuple

import pytest
import torch

from conftest import make_tree
from pixfeed.datasets import open_dataset
from pixfeed.errors import OptionError
from pixfeed.loaders import make_loader
from pixfeed.loaders._testing import ArrayDataset, random_images
from pixfeed.packers import pack

BATCH, SEED = 4, 7
Batch = Tuple[torch.Tensor, torch.Tensor]


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """18 images as stored pixels (mmap), encoded (LMDB, HDF5) and WebDataset shards of 4 (the last of 2)."""
    root = tmp_path_factory.mktemp("resume")
    src = make_tree(root / "src", per_class=6)  # 18 images
    pack(src, root / "mmap", "mmap", store="pixels", size=24, workers=1)
    pack(src, root / "lmdb", "lmdb", store="encoded", workers=1)
    pack(src, root / "hdf5", "hdf5", store="encoded", workers=1)
    pack(src, root / "wds", "wds", store="encoded", shard_size=4, workers=1)
    return root


def crops(path, **options):
    return open_dataset(path, size=12, crop="random", **options)


def batches(loader, count=None) -> List[Batch]:
    out = []
    for images, labels in loader:
        out.append((images.clone(), labels.clone()))
        if len(out) == count:
            break
    return out


def json_round_trip(state: dict) -> dict:
    text = json.dumps(state)
    assert len(text) < 600, text
    return json.loads(text)


def assert_same(got: List[Batch], expected: List[Batch]) -> None:
    assert len(got) == len(expected)
    for (images, labels), (want_images, want_labels) in zip(got, expected):
        assert torch.equal(labels, want_labels)
        assert torch.equal(images, want_images)


def resumed_run(make, stop: int, epochs: int = 2) -> List[Batch]:
    """``stop`` batches from one loader, the rest of ``epochs`` epochs from a new one loaded with its state."""
    first = make(0)
    head = batches(first, stop)
    state = json_round_trip(first.state_dict())
    del first
    second = make(1)
    second.load_state_dict(state)
    return head + [batch for _ in range(epochs) for batch in batches(second)]


@pytest.mark.parametrize("fmt,stop", [("mmap", 3), ("lmdb", 5), ("hdf5", 2)])
def test_map_style_resume_is_exact_with_other_workers_and_prefetch(packs, fmt, stop):
    dataset = crops(packs / fmt)
    options = [dict(num_workers=2, prefetch_factor=3), dict(num_workers=1, prefetch_factor=1)]
    make = lambda k: make_loader(dataset, BATCH, seed=SEED, **options[k])  # noqa: E731
    reference = make_loader(dataset, BATCH, seed=SEED, num_workers=0)
    expected = batches(reference) + batches(reference)
    assert_same(resumed_run(make, stop), expected)
    in_process = make_loader(dataset, BATCH, seed=SEED, num_workers=0)
    assert_same(batches(in_process, 2), expected[:2])  # crops do not depend on the worker either


def test_augmented_samples_resume_exactly_and_state_says_what_was_consumed():
    dataset = ArrayDataset(random_images(23, 6, 6), augment=True)
    make = lambda k: make_loader(dataset, BATCH, seed=SEED, num_workers=2 - k)  # noqa: E731
    reference = make(0)
    expected = batches(reference) + batches(reference)
    assert_same(resumed_run(make, 4), expected)
    loader = make(1)
    batches(loader, 2)
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"], state["start"], state["world_size"]) == (0, 2 * BATCH, 0, 1)
    batches(loader)  # a new iteration is the next epoch, read to its end
    assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (2, 0)


class Rank:
    """A loader made and used as rank ``rank`` of ``world`` (RANK and WORLD_SIZE set around every use:
    the world is looked up when each epoch starts)."""

    def __init__(self, monkeypatch, dataset, rank: int, world: int, drop_last: bool) -> None:
        self.env, self.rank, self.world = monkeypatch, rank, world
        self.loader = self.run(make_loader, dataset, BATCH, seed=SEED, drop_last=drop_last, num_workers=0,
                               distributed=True)

    def run(self, fn, *args, **kwargs):
        self.env.setenv("RANK", str(self.rank))
        self.env.setenv("WORLD_SIZE", str(self.world))
        return fn(*args, **kwargs)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("worlds", [(2, 3), (2, 1), (3, 2, 4)])
def test_elastic_resume_reads_every_sample_once(monkeypatch, worlds, drop_last):
    n = 43
    dataset = ArrayDataset(random_images(n, 2, 2))
    seen, state = Counter(), None
    for step, world in enumerate(worlds):
        ranks = [Rank(monkeypatch, dataset, rank, world, drop_last) for rank in range(world)]
        if state is not None:
            for r in ranks:
                r.run(r.loader.load_state_dict, state)
        last = step == len(worlds) - 1
        before = 0 if state is None else state["start"] + state["consumed"] * state["world_size"]
        per_rank = [r.run(batches, r.loader, None if last else 2) for r in ranks]
        assert len({len(b) for b in per_rank}) == 1, "ranks got different numbers of batches"
        seen.update(int(label) for b in per_rank for _, labels in b for label in labels)
        states = [json_round_trip(r.run(r.loader.state_dict)) for r in ranks]
        assert [s["rank"] for s in states] == list(range(world)) and {s["world_size"] for s in states} == {world}
        assert all({**s, "rank": 0} == {**states[0], "rank": 0} for s in states)
        state = states[0]
    world = worlds[-1]
    if drop_last:  # the sampler leaves out up to world - 1 samples, each rank its last partial batch
        kept = (n - before) // world // BATCH * BATCH * world
        assert max(seen.values()) == 1 and len(seen) == before + kept
    else:  # up to world - 1 samples from the start of the order repeat, to give every rank as many
        assert len(seen) == n and sum(seen.values()) - n == (before - n) % world
    assert state["epoch"] == 1 and state["consumed"] == 0


def test_wds_resume_is_exact_with_the_same_workers(packs):
    dataset = crops(packs / "wds", buffer=5)
    make = lambda k: make_loader(dataset, 3, seed=SEED, num_workers=2, prefetch_factor=[1, 3][k])  # noqa: E731
    reference = make(0)
    expected = batches(reference) + batches(reference)
    labels = Counter(int(label) for _, b in expected for label in b)
    assert sum(labels.values()) == 36  # 18 samples, two epochs
    for stop in (1, 4, 5):
        assert_same(resumed_run(make, stop), expected)


def test_wds_refuses_another_worker_count(packs):
    dataset = crops(packs / "wds")
    loader = make_loader(dataset, 3, seed=SEED, num_workers=2)
    batches(loader, 2)
    state = loader.state_dict()
    with pytest.raises(OptionError, match="make the loader with num_workers=2 "):
        make_loader(dataset, 3, seed=SEED, num_workers=1).load_state_dict(state)
    with pytest.raises(OptionError, match=r"saved by a run of 2 ranks \(the process group's size\), this one has 1; "
                                          r"a WebDataset resumes only on as many ranks as saved it: launch as many "
                                          r"processes \(torchrun --nproc-per-node\)"):
        make_loader(dataset, 3, seed=SEED, num_workers=2).load_state_dict({**state, "world_size": 2})


def test_a_state_of_another_dataset_seed_or_layout_is_refused(packs, tmp_path):
    dataset = crops(packs / "mmap")
    loader = make_loader(dataset, BATCH, seed=SEED, num_workers=0)
    batches(loader, 1)
    state = loader.state_dict()
    pack(make_tree(tmp_path / "src", per_class=6), tmp_path / "again", "mmap", store="pixels", size=24, workers=1)
    for other in (crops(tmp_path / "again"), ArrayDataset(random_images(18, 2, 2))):  # a re-pack: another manifest
        with pytest.raises(OptionError, match="another dataset"):
            make_loader(other, BATCH, seed=SEED, num_workers=0).load_state_dict(state)
    with pytest.raises(OptionError, match="seed=7"):
        make_loader(dataset, BATCH, seed=8, num_workers=0).load_state_dict(state)
    with pytest.raises(OptionError, match="layout version 0"):
        loader.load_state_dict({**state, "layout_version": 0})
    with pytest.raises(OptionError, match="not a pixfeed loader state"):
        loader.load_state_dict({"epoch": 0})
