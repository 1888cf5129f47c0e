"""The usable-CPU count and the worker rule, against fake cgroup files."""
from __future__ import annotations

import pytest

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
