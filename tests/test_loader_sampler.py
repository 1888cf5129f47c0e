"""make_loader(sampler=, collate_fn=): a caller's sampler and collate pass through, the plan says what
pixfeed then cannot guarantee, and what it cannot honour is refused by name (issue #42 item 12)."""
from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
from conftest import make_tree
from torch.utils.data import DistributedSampler, Sampler, WeightedRandomSampler, default_collate

import pixfeed
from pixfeed.errors import OptionError


class Reversed(Sampler):
    """A caller's own sampler: every index, last first, then a second look at index 0."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epochs: list = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self):
        return iter([*range(self.n - 1, -1, -1), 0])

    def __len__(self) -> int:
        return self.n + 1


class Indexed(torch.utils.data.Dataset):
    """Samples whose label is their index."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int):
        return torch.full((3, 2, 2), i, dtype=torch.uint8), i


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampler")
    src = make_tree(root / "src")
    for fmt in ("mmap", "wds"):
        pixfeed.pack(src, root / fmt, fmt, workers=1)
    return root


def mixup(samples):
    """A mixup collate as people write them: default_collate, then each image blended with the next."""
    images, labels = default_collate(samples)
    mixed = images.float() * 0.5 + images.roll(1, 0).float() * 0.5
    return mixed, labels, labels.roll(1, 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_callers_sampler_decides_the_order_and_gets_set_epoch(workers):
    sampler = Reversed(10)
    loader = pixfeed.make_loader(Indexed(), 4, sampler=sampler, num_workers=workers)
    for epoch in range(2):
        labels = [int(x) for _, y in loader for x in y]
        assert labels == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0]
    assert sampler.epochs == [0, 1] and len(loader) == 3
    assert loader.pixfeed_plan.order == "sampler" and "Reversed" in str(loader.pixfeed_plan)
    assert "same crop" in loader.pixfeed_plan.reasons["sampler"]  # what it cannot guarantee, said


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixup_collate_gets_samples_on_the_batch_path_too(packs, workers):
    ds = pixfeed.open_dataset(packs / "mmap", size=12, crop="random")
    weighted = WeightedRandomSampler([1.0] * len(ds), 8, generator=torch.Generator().manual_seed(0))
    loader = pixfeed.make_loader(ds, 4, sampler=weighted, collate_fn=mixup, num_workers=workers)
    assert loader.pixfeed_plan.path == "batch" and loader.pixfeed_plan.collate_fn == "mixup"
    batches = list(loader)
    assert len(batches) == len(loader) == 2
    for images, labels, partner in batches:
        assert images.dtype == torch.float32 and images.shape == (4, 3, 12, 12)
        assert torch.equal(partner, labels.roll(1, 0))
    seen = []
    pixfeed.make_loader(ds, 4, collate_fn=lambda samples: seen.extend(samples) or 0, num_workers=0, shuffle=False)\
        .__iter__().__next__()
    assert [s[0].shape for s in seen] == [(3, 12, 12)] * 4 and [int(s[1]) for s in seen] == [ds[i][1] for i in range(4)]


def test_what_a_callers_sampler_cannot_be_combined_with_is_refused_by_name(packs, monkeypatch):
    ds = pixfeed.open_dataset(packs / "mmap", size=12)
    mine = Reversed(len(ds))
    assert pixfeed.make_loader(ds, 4, sampler=mine, shuffle=False).pixfeed_plan.order == "sampler"  # as torch's
    for option, value in (("shuffle", True), ("order", "quasi_random"), ("io_ahead", 1 << 20)):
        with pytest.raises(OptionError, match=f"sampler and {option}"):
            pixfeed.make_loader(ds, 4, sampler=mine, **{option: value})
    with pytest.raises(OptionError, match="sampler and an iterable dataset"):
        pixfeed.make_loader(pixfeed.open_dataset(packs / "wds", size=12), 4, sampler=mine)
    with pytest.raises(OptionError, match="collate_fn and memory_format"):
        pixfeed.make_loader(ds, 4, collate_fn=mixup, memory_format=torch.contiguous_format)
    with pytest.raises(OptionError, match="collate_fn and device"):
        pixfeed.make_loader(ds, 4, collate_fn=mixup, device="cpu")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(OptionError, match="sampler and a world of 2 ranks: Reversed does not split by rank"):
        pixfeed.make_loader(ds, 4, sampler=mine, distributed=True)
    with pytest.raises(OptionError, match="num_replicas=2, rank=0, but this is rank 1 of 2"):
        pixfeed.make_loader(ds, 4, sampler=DistributedSampler(ds, num_replicas=2, rank=0), distributed=True)
    split = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=False)
    loader = pixfeed.make_loader(ds, 2, sampler=split, distributed=True, num_workers=0)
    assert [int(x) for _, y in loader for x in y] == [ds[i][1] for i in range(1, len(ds), 2)]
    assert len(pixfeed.make_loader(ds, 4, sampler=mine, distributed=False, num_workers=0)) == 4  # another splits


@pytest.mark.parametrize("workers", [0, 2])
def test_a_callers_sampler_resumes_at_the_step_it_saved(workers):
    ds = Indexed()
    loader = pixfeed.make_loader(ds, 3, sampler=Reversed(10), num_workers=workers)
    batches = iter(loader)
    next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [y.tolist() for _, y in batches]
    again = pixfeed.make_loader(ds, 3, sampler=Reversed(10), num_workers=workers)
    again.load_state_dict(state)
    assert len(again) == len(rest) == 3 and [y.tolist() for _, y in again] == rest
    assert [y.tolist() for _, y in again][0] == [9, 8, 7]  # the next epoch reads whole
    with pytest.raises(OptionError, match="order 'sampler Reversed'"):
        pixfeed.make_loader(ds, 3, num_workers=0).load_state_dict(state)


def test_a_loader_with_workers_is_freed_by_reference_counting():
    """No reference cycle through a loader with workers (the resumable batches of a caller's sampler hold it
    weakly): left to the garbage collector, its queues could close before its workers stop (5 s each)."""
    gc.disable()
    try:
        for sampler in (None, Reversed(10)):
            loader = pixfeed.make_loader(Indexed(), 4, sampler=sampler, num_workers=2)
            assert len(list(loader)) == 3
            freed = weakref.ref(loader)
            del loader
            assert freed() is None
    finally:
        gc.enable()
