"""autotune measures candidate loader settings and picks a measurably faster one."""
from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import Dataset

import pixfeed
from pixfeed.loaders import tune as tuning
from pixfeed.errors import OptionError


class DelayDataset(Dataset):
    """Each item waits ``delay`` seconds (like a read from slow storage), so workers overlap the waits."""

    def __init__(self, delay: float, count: int = 64):
        self.delay, self.count = delay, count

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        time.sleep(self.delay)
        return torch.full((3, 4, 4), i % 256, dtype=torch.uint8), i


def test_picks_workers_over_a_bad_in_process_setting():
    state = torch.get_rng_state()
    result = pixfeed.autotune(DelayDataset(0.01), 4, candidates=[(0, None), (4, 2)], budget_s=2.0)
    slow, fast = result.candidates
    assert result.best == fast and fast.num_workers == 4 and fast.prefetch_factor == 2
    assert fast.images_per_s > 2 * slow.images_per_s  # ideal 4x: four workers overlap their 10 ms waits
    assert slow.batches >= tuning.MIN_BATCHES and fast.batches >= tuning.MIN_BATCHES
    assert torch.equal(torch.get_rng_state(), state)
    assert "*" in str(result) and result.to_dict()["best"]["num_workers"] == 4


def test_make_loader_tune(monkeypatch):
    monkeypatch.setattr(tuning, "BUDGET_S", 2.5)
    monkeypatch.setattr(tuning, "available_cpus", lambda: 2)
    dataset = DelayDataset(0.01)
    loader = pixfeed.make_loader(dataset, 4, num_workers="tune", shuffle=False)
    result = loader.pixfeed_tuning
    settings = [(c.num_workers, c.prefetch_factor) for c in result.candidates]
    assert settings[:4] == [(0, None), (1, 2), (2, 2), (4, 2)] and settings[4] == (result.best.num_workers, 4)
    assert loader.num_workers == result.best.num_workers > 0
    assert "autotuned" in loader.pixfeed_plan.reasons["num_workers"]
    assert [int(x) for _, labels in loader for x in labels] == list(range(64))


def test_bad_budget():
    with pytest.raises(OptionError, match="budget_s"):
        tuning.autotune(DelayDataset(0), 4, budget_s=0)


def test_a_given_prefetch_is_kept(monkeypatch):
    monkeypatch.setattr(tuning, "autotune", lambda *a, candidates, **k: tuning.TuneResult(
        [tuning.Candidate(w, p, float(w), 2) for w, p in candidates]))
    monkeypatch.setattr(tuning, "available_cpus", lambda: 2)
    loader = pixfeed.make_loader(DelayDataset(0), 4, num_workers="tune", prefetch_factor=3)
    assert [(c.num_workers, c.prefetch_factor) for c in loader.pixfeed_tuning.candidates] == [
        (0, None), (1, 3), (2, 3), (4, 3)]
    assert (loader.num_workers, loader.prefetch_factor) == (4, 3)


def test_tune_with_persistent_workers_measures_the_no_worker_candidate_too(monkeypatch):
    monkeypatch.setattr(tuning, "available_cpus", lambda: 2)
    result = pixfeed.autotune(DelayDataset(0.0), 4, candidates=[(0, None), (1, 2)], budget_s=0.5,
                              persistent_workers=True, shuffle=False)
    assert [c.num_workers for c in result.candidates] == [0, 1]
    assert all(c.images_per_s > 0 for c in result.candidates)
