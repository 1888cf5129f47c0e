"""The usable-CPU count and the worker rule, against fake cgroup files."""
from __future__ import annotations

import pytest
import torch

from pixfeed.machine import cpus
from pixfeed.loaders import make_loader
from pixfeed.loaders._testing import ArrayDataset, random_images
from pixfeed.loaders.plan import choose_workers


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 8)


def write(root, name, text):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("files, expected", [
    ({"cpu.max": "max 100000\n"}, 8),
    ({"cpu.max": "250000 100000\n"}, 3),          # 2.5 CPUs round up
    ({"cpu.max": "50000 100000\n"}, 1),           # half a CPU is still one
    ({"cpu.max": "2000000 100000\n"}, 8),         # quota above affinity: affinity wins
    ({"cpu/cpu.cfs_quota_us": "200000", "cpu/cpu.cfs_period_us": "100000"}, 2),  # v1
    ({"cpu.cfs_quota_us": "400000", "cpu.cfs_period_us": "100000"}, 4),          # v1, flat
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, 8),      # v1, no quota
    ({}, 8),                                       # no cgroup files at all
    ({"cpu.max": "garbage"}, 8),
])
def test_available_cpus_honours_cgroup_quota(tmp_path, eight_cores, files, expected):
    for name, text in files.items():
        write(tmp_path, name, text)
    assert cpus.available_cpus(tmp_path) == expected


def test_available_cpus_uses_affinity_not_cpu_count(monkeypatch, tmp_path):
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0, 3}, raising=False)
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 64)
    assert cpus.available_cpus(tmp_path) == 2


@pytest.mark.parametrize("cpu_count, batches, expected", [(1, 100, 0), (2, 100, 2), (2, 1, 1), (3, 100, 2), (8, 100, 7), (8, 3, 3)])
def test_worker_rule_keeps_a_core_and_caps_at_useful(cpu_count, batches, expected):
    dataset = ArrayDataset(random_images(4), augment=True)  # cpu_bound: workers are wanted
    workers, reason = choose_workers("auto", dataset, "batch", cpu_count, batches)
    assert workers == expected and reason


def test_make_loader_reads_the_quota(monkeypatch, tmp_path, eight_cores):
    write(tmp_path, "cpu.max", "300000 100000")
    monkeypatch.setattr(cpus, "CGROUP_ROOT", tmp_path)
    loader = make_loader(ArrayDataset(random_images(64), augment=True), 4)
    assert (loader.pixfeed_plan.cpus, loader.num_workers) == (3, 2)


class StoredPixelStream(torch.utils.data.IterableDataset):
    """An iterable dataset of stored 224x224 pixels: no decoding (cpu_bound False)."""
    cpu_bound = False
    fixed_shape = (3, 224, 224)

    def __iter__(self):
        return iter(())


@pytest.mark.parametrize("read_us, expected", [(2000, 2), (800, 2), (10, 0), (None, 0)])
def test_workers_for_a_stream_of_stored_pixels_follow_what_a_sample_costs_to_read(read_us, expected):
    """Reading a WebDataset sample of stored pixels walks the tar, parses members and checks a hash: more
    than handing the 150 KB over from a worker (719 images/s in process against 1,615 with 2 workers);
    one read for less than that stays in process, as does one whose cost could not be measured."""
    cost = None if read_us is None else read_us * 1e-6
    workers, reason = choose_workers("auto", StoredPixelStream(), "iterable", 2, None, None, cost)
    assert workers == expected, reason
    if read_us is not None:
        assert f"reading a sample costs {read_us:,} us in process (measured)" in reason
    batch_path, _ = choose_workers("auto", StoredPixelStream(), "batch", 2, None, None, 2e-3)
    assert batch_path == 0  # a gathered batch is one copy: in process, measured or not


def test_make_loader_measures_what_a_webdataset_of_stored_pixels_costs_to_read(tmp_path, monkeypatch):
    """The cost comes from reading the pack's samples in a throwaway process (probe.read_seconds), whose
    figure the plan shows; 16x16 samples cost far more to read than their 776 bytes cost to hand over."""
    from conftest import write_image
    from pixfeed.datasets import open_dataset
    from pixfeed.loaders import loader as loader_module
    from pixfeed.packers import pack

    for i in range(40):
        write_image(tmp_path / "src" / f"c{i % 2}" / f"{i:02d}.png", size=(16, 16), seed=i)
    pack(tmp_path / "src", tmp_path / "wds", "wds", store="pixels", size=16, workers=1, shard_size=10)
    monkeypatch.setattr(cpus, "available_cpus", lambda *a: 2)
    monkeypatch.setattr(loader_module, "available_cpus", lambda *a: 2)
    measured = []
    real = loader_module.read_seconds
    monkeypatch.setattr(loader_module, "read_seconds", lambda ds: measured.append(real(ds)) or measured[-1])
    loader = make_loader(open_dataset(tmp_path / "wds"), 8)
    assert len(measured) == 1 and measured[0] > 0
    assert loader.num_workers == 2 and "(measured)" in loader.pixfeed_plan.reasons["num_workers"]
    assert sum(len(labels) for _, labels in loader) == 40
    monkeypatch.setattr(loader_module, "read_seconds", lambda ds: 1e-9)  # a read cheaper than its hand-off
    assert make_loader(open_dataset(tmp_path / "wds"), 8).num_workers == 0
    assert make_loader(open_dataset(tmp_path / "wds"), 8, num_workers=0).num_workers == 0  # asked: not measured
