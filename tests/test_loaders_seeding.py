"""Worker RNGs differ per worker, rank and epoch, and repeat for the same seed."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

from pixfeed.loaders import make_loader
from pixfeed.loaders.seeding import WorkerSeeder


class Draws(Dataset):
    """Each sample: worker id and one draw from Python's, NumPy's and torch's RNG."""
    cpu_bound = True

    def __len__(self):
        return 8

    def __getitem__(self, index):
        worker = -1 if get_worker_info() is None else get_worker_info().id
        draws = [worker, random.random(), np.random.rand(), torch.rand(()).item()]
        return torch.tensor(draws, dtype=torch.float64)


def epochs(seed, persistent, count=2):
    loader = make_loader(Draws(), 1, shuffle=False, num_workers=2, persistent_workers=persistent, seed=seed)
    return [torch.cat(list(loader)) for _ in range(count)]


@pytest.mark.parametrize("persistent", [True, False])
def test_draws_differ_per_worker_and_epoch_and_repeat_per_seed(persistent):
    first, second = epochs(seed=5, persistent=persistent)
    by_worker = [first[first[:, 0] == w, 1:] for w in (0, 1)]
    assert len(by_worker[0]) == len(by_worker[1]) == 4
    assert not (by_worker[0][:, None] == by_worker[1][None]).any(), "two workers drew the same numbers"
    assert not (first[:, 1:] == second[:, 1:]).any(), "an epoch repeated the previous epoch's draws"
    again = epochs(seed=5, persistent=persistent)
    assert torch.equal(torch.stack(again), torch.stack([first, second]))
    assert not torch.equal(epochs(seed=6, persistent=persistent, count=1)[0], first)


def state_after(seeder, base=1234, worker=0):
    torch.manual_seed(base + worker)
    seeder(worker)
    return random.random(), float(np.random.rand()), torch.rand(()).item()


def test_seeder_mixes_rank_and_worker():
    rank0, rank1 = state_after(WorkerSeeder(0)), state_after(WorkerSeeder(1))
    assert all(a != b for a, b in zip(rank0, rank1))
    assert state_after(WorkerSeeder(0)) == rank0
    assert state_after(WorkerSeeder(0), worker=1) != rank0


def test_probing_a_sample_leaves_the_callers_rngs_alone():
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    assert make_loader(Draws(), 1, num_workers=1).pixfeed_plan.batch_bytes == 4 * 8  # sample 0 was probed
    after = (random.random(), float(np.random.rand()), torch.rand(()).item())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    assert after == (random.random(), float(np.random.rand()), torch.rand(()).item())


class OwnBatches(torch.utils.data.Dataset):
    """A user's dataset that reads a batch in one call (a query), drawing a random number per sample."""

    def __init__(self) -> None:
        self.calls = {"item": 0, "items": 0}

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int):
        self.calls["item"] += 1
        return torch.tensor([index]), torch.rand(1)

    def __getitems__(self, indices):
        self.calls["items"] += 1
        return [(torch.tensor([i]), torch.rand(1)) for i in indices]


def test_a_dataset_with_getitems_gets_one_call_per_batch_seeded_per_batch():
    dataset = OwnBatches()
    loader = make_loader(dataset, 8, num_workers=0, seed=3)
    first = [(i.flatten().tolist(), r.flatten().tolist()) for i, r in loader]
    assert dataset.calls == {"item": 0, "items": 3}
    again = [(i.flatten().tolist(), r.flatten().tolist()) for i, r in make_loader(OwnBatches(), 8, num_workers=0,
                                                                                  seed=3)]
    assert again == first  # the same seed: the same batches and draws
    other = [r.flatten().tolist() for _, r in make_loader(OwnBatches(), 8, num_workers=0, seed=4)]
    assert other != [r for _, r in first]
