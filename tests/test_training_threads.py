"""Torch's threads in the training process are capped while workers decode, and given back after."""
from __future__ import annotations

import pytest
import torch

from conftest import make_tree
from pixfeed.datasets import open_dataset
from pixfeed.errors import OptionError
from pixfeed.loaders import loader as loader_module
from pixfeed.loaders import make_loader
from pixfeed.packers import pack


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    root = tmp_path_factory.mktemp("training_threads")
    pack(make_tree(root / "src", per_class=4), root / "encoded", "mmap", store="encoded", workers=1)
    return open_dataset(root / "encoded", size=16)


@pytest.fixture
def torch_threads():
    """Torch at 3 threads for the test, whatever the machine; the setting before it comes back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(before)


@pytest.mark.parametrize("cpus, workers, capped", [(2, 2, 1), (4, 2, 2), (3, 2, 1)])
def test_the_plan_caps_torch_at_the_cpus_the_workers_leave(encoded, torch_threads, monkeypatch, cpus, workers,
                                                          capped):
    monkeypatch.setattr(loader_module, "available_cpus", lambda: cpus)
    plan = make_loader(encoded, 4, num_workers=workers).pixfeed_plan
    assert plan.training_threads == capped
    assert f"3 -> {capped} while batches are read" in plan.reasons["training_threads"]
    assert "training_threads" in str(plan)


def test_the_plan_leaves_torch_alone_without_workers_or_when_asked(encoded, torch_threads, monkeypatch):
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 8)
    assert make_loader(encoded, 4, num_workers=0).pixfeed_plan.training_threads is None
    assert make_loader(encoded, 4, num_workers=2).pixfeed_plan.training_threads is None  # 3 <= the 6 left
    asked = make_loader(encoded, 4, num_workers=2, training_threads=None).pixfeed_plan
    assert asked.training_threads is None and "training_threads=None" in asked.reasons["training_threads"]
    assert make_loader(encoded, 4, num_workers=2, training_threads=2).pixfeed_plan.training_threads == 2
    with pytest.raises(OptionError, match="training_threads"):
        make_loader(encoded, 4, num_workers=2, training_threads=0)


def test_threads_are_capped_while_an_epoch_is_read_and_given_back(encoded, torch_threads, monkeypatch):
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 2)
    loader = make_loader(encoded, 4, num_workers=2)
    seen = {torch.get_num_threads() for _ in loader}
    assert seen == {1} and torch.get_num_threads() == torch_threads
    for _ in loader:  # an epoch left part-way: given back when its iterator goes
        assert torch.get_num_threads() == 1
        break
    assert torch.get_num_threads() == torch_threads


def test_nested_epochs_give_back_the_setting_found_before_the_first(encoded, torch_threads, monkeypatch):
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 2)
    train, val = make_loader(encoded, 4, num_workers=2), make_loader(encoded, 4, num_workers=1)
    outer = iter(train)
    next(outer)
    inner = [torch.get_num_threads() for _ in val]
    assert set(inner) == {1} and torch.get_num_threads() == 1  # the outer epoch is still being read
    del outer
    assert torch.get_num_threads() == torch_threads


def test_torch_without_openmp_is_left_alone(encoded, torch_threads, monkeypatch):
    """Only OpenMP's idle threads spin; torch's native pool blocks, and capping it would only warn."""
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 2)
    monkeypatch.setattr(torch.__config__, "parallel_info", lambda: "ATen parallel backend: native thread pool")
    plan = make_loader(encoded, 4, num_workers=2).pixfeed_plan
    assert plan.training_threads is None and "not OpenMP" in plan.reasons["training_threads"]
