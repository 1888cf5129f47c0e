"""The world is resolved when each epoch starts: a loader made before the process group splits once it exists,
and an epoch driven by a framework's own DataLoader (Accelerate's prepare) is split by that framework only."""
from __future__ import annotations

import math
import pickle
import sys
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DistributedSampler, IterableDataset

from pixfeed.loaders import make_loader
from pixfeed.loaders._testing import ArrayDataset, random_images
from pixfeed.machine.world import World

COUNT = 37


class Shards(IterableDataset):
    """Splits itself by ``rank``/``world_size``; no ``set_epoch``, so its workers persist between epochs."""

    def __init__(self):
        self.rank, self.world_size = 0, 1

    def __iter__(self):
        return iter(range(self.rank, 10, self.world_size))


def labels_of(loader):
    return [int(x) for batch in loader for x in (batch[1] if isinstance(batch, (list, tuple)) else batch)]


@pytest.fixture
def dataset():
    return ArrayDataset(random_images(COUNT))


@pytest.fixture
def become_rank_1_of_2(monkeypatch):
    """From now on this process is rank 1 of 2 (as after init_process_group)."""
    return lambda: monkeypatch.setattr(World, "detect", classmethod(lambda cls, *args, **kwargs: World(1, 2)))


def test_a_loader_made_before_the_process_group_splits_once_it_exists(dataset, become_rank_1_of_2):
    loader = make_loader(dataset, 4, num_workers=0)
    assert sorted(labels_of(loader)) == list(range(COUNT))  # one process
    become_rank_1_of_2()
    assert len(loader) == math.ceil(math.ceil(COUNT / 2) / 4)
    expected = DistributedSampler(dataset, num_replicas=2, rank=1, seed=0)
    expected.set_epoch(1)
    assert labels_of(loader) == list(expected)
    assert loader.pixfeed_plan.world == World(1, 2)
    made_after = make_loader(dataset, 4, num_workers=0)
    made_after.set_epoch(1)
    assert labels_of(made_after) == list(expected)


def test_persistent_workers_are_restarted_when_the_world_changes(become_rank_1_of_2):
    loader = make_loader(Shards(), 2, num_workers=1)
    assert loader.persistent_workers
    assert sorted(labels_of(loader)) == list(range(10))
    become_rank_1_of_2()
    assert sorted(labels_of(loader)) == [1, 3, 5, 7, 9]  # the old worker's copy still had world size 1
    assert loader.worker_init_fn.rank == 1


def test_set_epoch_on_the_sampler_decides_the_next_epoch(dataset):
    """Lightning's fit loop calls the sampler's set_epoch (its own count, a resumed run's too)."""
    straight = make_loader(dataset, 8)
    orders = [labels_of(straight) for _ in range(5)]
    resumed = make_loader(dataset, 8)
    resumed.sampler.set_epoch(3)
    assert labels_of(resumed) == orders[3]
    assert labels_of(resumed) == orders[4]


def test_an_epoch_driven_by_a_wrapper_is_not_split_while_accelerate_splits(dataset, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = make_loader(dataset, 4, num_workers=0, distributed=True)
    assert len(labels_of(loader)) == math.ceil(COUNT / 2)  # the PixfeedLoader drives: split by pixfeed
    loader.sampler.set_epoch(1)  # a wrapper's DataLoader drives, without Accelerate: still split here
    assert len(list(loader.sampler)) == math.ceil(COUNT / 2)
    state = SimpleNamespace(PartialState=SimpleNamespace(_shared_state={"num_processes": 2}))
    monkeypatch.setitem(sys.modules, "accelerate.state", state)
    loader.sampler.set_epoch(1)  # Accelerate's prepared loader drives and splits the batches itself
    assert sorted(loader.sampler) == list(range(COUNT)) and len(loader.sampler) == COUNT
    assert len(labels_of(loader)) == math.ceil(COUNT / 2)  # the PixfeedLoader itself still splits


@pytest.mark.parametrize("kind", ["pixels", "samples"])
def test_batches_are_contiguous_while_accelerate_runs_several_processes(monkeypatch, kind):
    """Accelerate's dispatch_batches broadcasts batches raw: channels_last images would arrive scrambled."""
    dataset = ArrayDataset(random_images(8, 5, 7))
    if kind == "samples":
        dataset.fixed_shape = None  # collated sample by sample
    loader = make_loader(dataset, 4, num_workers=0, shuffle=False)
    images, _ = next(iter(loader))
    assert not images.is_contiguous() and images.is_contiguous(memory_format=torch.channels_last)
    state = SimpleNamespace(PartialState=SimpleNamespace(_shared_state={"num_processes": 2}))
    monkeypatch.setitem(sys.modules, "accelerate.state", state)
    spawned = pickle.loads(pickle.dumps(loader.collate_fn))  # as a spawned worker gets it
    monkeypatch.delitem(sys.modules, "accelerate.state")
    batch = spawned([dataset[i] for i in range(4)] if kind == "samples" else dataset.get_batch(range(4)))
    assert batch[0].is_contiguous() and torch.equal(batch[0], images)
