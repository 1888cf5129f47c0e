"""pixfeed doctor against fake cgroup files, a fake /proc/meminfo and a fake /dev/shm."""
from __future__ import annotations

import json
import os
from collections import namedtuple

import pytest

from pixfeed.cli import main
from pixfeed.diagnose import storage, system
from pixfeed.diagnose.doctor import diagnose, render
from pixfeed.machine import cpus

MiB, GiB = 2**20, 2**30
StatVFS = namedtuple("StatVFS", "f_blocks f_frsize f_bavail")


def write(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def fake_meminfo(tmp_path, total, available):
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {total // 1024} kB\nMemFree:  1 kB\nMemAvailable:   {available // 1024} kB\n")
    return path


@pytest.fixture
def eight_cores(monkeypatch):
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 8)
    monkeypatch.setattr(system.os, "cpu_count", lambda: 8)


def test_cpu_quota_below_cpu_count_is_flagged(tmp_path, eight_cores):
    finding = system.check_cpus(write(tmp_path, {"cpu.max": "150000 100000\n"}))
    assert finding.status == "warn" and finding.data["usable"] == 2 and finding.data["cgroup_quota"] == 1.5
    assert "at most 2 loader workers" in finding.advice and "os.cpu_count()=8" in finding.advice


def test_one_usable_cpu_is_explained_in_words(tmp_path, eight_cores):
    finding = system.check_cpus(write(tmp_path, {"cpu.max": "100000 100000\n"}))
    assert "read in the training process (num_workers=0" in finding.advice and "<= 0" not in finding.advice


def test_no_quota_is_fine(tmp_path, eight_cores):
    finding = system.check_cpus(tmp_path)
    assert finding.status == "ok" and finding.data["usable"] == 8


@pytest.mark.parametrize("files, limit, usage", [
    ({"memory.max": str(3 * GiB), "memory.current": str(GiB)}, 3 * GiB, GiB),                   # v2
    ({"memory.max": "max", "memory.current": str(GiB)}, None, GiB),                             # v2, no limit
    ({"memory/memory.limit_in_bytes": str(3 * GiB), "memory/memory.usage_in_bytes": "0"}, 3 * GiB, 0),  # v1
    ({"memory/memory.limit_in_bytes": "9223372036854771712"}, None, None),                      # v1 "unlimited"
    ({}, None, None),
])
def test_cgroup_memory_versions(tmp_path, files, limit, usage):
    assert system.cgroup_memory(write(tmp_path, files)) == {"limit": limit, "usage": usage}


def test_memory_free_is_the_smaller_of_host_and_cgroup(tmp_path):
    root = write(tmp_path / "cg", {"memory.max": str(8 * GiB), "memory.current": str(7 * GiB)})
    finding = system.check_memory(root, fake_meminfo(tmp_path, 64 * GiB, 40 * GiB))
    assert finding.data["free"] == GiB and finding.status == "warn" and "fewer workers" in finding.advice


def test_container_limit_below_host_is_reported(tmp_path):
    root = write(tmp_path / "cg", {"memory.max": str(8 * GiB), "memory.current": str(GiB)})
    finding = system.check_memory(root, fake_meminfo(tmp_path, 64 * GiB, 40 * GiB))
    assert finding.status == "info" and finding.data["free"] == 7 * GiB and "8.0 GiB" in finding.advice


def fake_shm(monkeypatch, total, free):
    monkeypatch.setattr(system.os, "statvfs", lambda path: StatVFS(total // 4096, 4096, free // 4096))


def test_docker_default_shm_is_too_small_for_imagenet_batches(monkeypatch):
    fake_shm(monkeypatch, 64 * MiB, 64 * MiB)  # docker's default --shm-size
    need = system.shm_need(256 * 3 * 224 * 224, workers=7, prefetch=2)  # 539 MiB
    finding = system.check_shm(need, "/fake/shm")
    assert finding.status == "warn"
    assert "--shm-size=2g" in finding.advice and "file_system" in finding.advice
    assert finding.data == {"path": "/fake/shm", "total": 64 * MiB, "free": 64 * MiB, "need": need}


def test_shm_with_room_is_fine(monkeypatch):
    fake_shm(monkeypatch, 8 * GiB, 8 * GiB)
    assert system.check_shm(100 * MiB, "/fake/shm").status == "ok"


def test_no_workers_need_no_shm(monkeypatch):
    fake_shm(monkeypatch, 64 * MiB, 64 * MiB)
    finding = system.check_shm(0, "/fake/shm")
    assert finding.status == "ok" and "do not pass through shared memory" in finding.advice


@pytest.mark.parametrize("installed, store, status, advised", [
    (True, "encoded", "ok", False), (False, "encoded", "info", True), (False, None, "info", True),
    (False, "pixels", "ok", False), (True, "pixels", "ok", False)])
def test_fast_decode_advised_only_when_missing_and_needed(monkeypatch, installed, store, status, advised):
    from pixfeed.image import jpeghead as _jpeghead
    from pixfeed.diagnose.doctor import check_decode

    monkeypatch.setattr(_jpeghead, "simplejpeg", _jpeghead.simplejpeg if installed else None)
    finding = check_decode(store)
    assert finding.status == status and ("pixfeed[fast]" in finding.advice) == advised


def test_slow_storage_advises_packing_only_a_folder():
    folder, _ = storage._advice(50e6, 100 * MiB, None, 0.0)
    dataset, _ = storage._advice(50e6, 100 * MiB, 1000.0, 0.0)
    assert "pixfeed pack" in folder and "pixfeed pack" not in dataset and "local NVMe" in dataset


def test_a_read_that_pauses_is_a_latency_spike_even_when_the_average_is_fast():
    note, status = storage._advice(2e9, 256 * MiB, None, 0.0, slowest=1.5)
    assert status == "warn" and "latency spike: one 8 MiB read took 1.5 s" in note and "stall_timeout" in note
    assert storage._advice(2e9, 256 * MiB, None, 0.0, slowest=0.2)[1] == "ok"  # short, however uneven
    assert storage._advice(10e6, 256 * MiB, None, 0.0, slowest=4.0)[0].count("spike") == 0  # 10 MB/s: 0.8 s a read


def test_missing_shm_dir(tmp_path):
    assert system.check_shm(MiB, str(tmp_path / "absent")).status == "info"


def test_storage_reads_files_up_to_the_limit(tmp_path):
    for i in range(3):
        (tmp_path / f"f{i}").write_bytes(os.urandom(MiB))
    assert storage.head(sorted(tmp_path.iterdir()), MiB + 1) == [tmp_path / "f0", tmp_path / "f1"]
    finding = storage.check_storage(tmp_path, limit=MiB + 1)
    assert finding.data["bytes"] == 2 * MiB and finding.data["files"] == 2
    assert finding.data["cold_bytes_per_s"] > 0 and finding.data["warm_bytes_per_s"] > 0
    assert 0 < finding.data["cold_slowest_read_s"] <= 2 * MiB / finding.data["cold_bytes_per_s"]


def test_storage_of_a_packed_dataset_uses_its_manifest(image_tree, tmp_path):
    from pixfeed.packers import pack

    m = pack(image_tree, tmp_path / "ds", "mmap", size=16)
    finding = storage.check_storage(tmp_path / "ds")
    assert finding.data["files"] == len(m["files"])
    assert finding.data["bytes_per_record"] == sum(f["bytes"] for f in m["files"].values()) / m["count"]
    assert "images/s" in finding.advice and "too little to judge" in finding.advice


def test_diagnose_runs_every_probe_on_fake_paths(tmp_path, monkeypatch, eight_cores):
    fake_shm(monkeypatch, 64 * MiB, 64 * MiB)
    root = write(tmp_path / "cg", {"cpu.max": "200000 100000", "memory.max": str(4 * GiB), "memory.current": "0"})
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "blob").write_bytes(b"x" * MiB)
    findings = diagnose(tmp_path / "data", cgroup_root=root, meminfo=fake_meminfo(tmp_path, 16 * GiB, 12 * GiB),
                        shm_dir="/fake/shm")
    by_check = {f.check: f for f in findings}
    assert {"cpus", "memory", "shared memory", "torch", "storage"} <= set(by_check)
    assert by_check["shared memory"].data["need"] == 256 * 3 * 224 * 224 * 2 * 2  # 2 usable CPUs: 2 workers
    assert "2 workers x 2 ready batches of 37 MiB need 147 MiB" in by_check["shared memory"].value
    assert by_check["storage"].data["bytes"] == MiB
    text = render(findings)
    assert all(f.check in text and f.advice in text for f in findings)


def test_cli_defaults_on_mixed_size_encoded_images(image_tree, tmp_path, capsys):
    from pixfeed.packers import pack

    pack(image_tree, tmp_path / "ds", "lmdb")
    assert main(["doctor", str(tmp_path / "ds"), "--json"]) == 0
    findings = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert findings["shared memory"]["data"]["need"] % (256 * 3 * 224 * 224) == 0  # sized at 224 for mixed sizes
    assert findings["storage"]["data"]["files"] >= 1


def test_cli_on_stored_pixels_sizes_shared_memory_for_random_crop_training(image_tree, tmp_path, capsys,
                                                                           monkeypatch):
    from pixfeed.packers import pack

    monkeypatch.setattr("pixfeed.diagnose.doctor.available_cpus", lambda root=None: 2)
    pack(image_tree, tmp_path / "ds", "mmap", size=16)
    assert main(["doctor", str(tmp_path / "ds"), "--json", "--read-mb", "1", "--batch-size", "4"]) == 0
    findings = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    # center crops of stored pixels are read in process, but training's random-resized crops go to workers
    shm = findings["shared memory"]
    assert shm["data"]["need"] == 4 * 3 * 16 * 16 * 2 * 2 and "no loader workers" not in shm["advice"]
    assert "random-crop training's 2 workers" in shm["value"] and findings["fast decode"]["status"] == "ok"


def test_cli_json(tmp_path, capsys):
    (tmp_path / "blob").write_bytes(b"x" * 1000)
    assert main(["doctor", str(tmp_path), "--json", "--batch-size", "8", "--size", "32"]) == 0
    findings = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert findings["storage"]["data"]["bytes"] == 1000
    assert findings["shared memory"]["data"]["need"] % (8 * 3 * 32 * 32) == 0


def test_cli_names_a_missing_path_and_bad_options(tmp_path, capsys):
    assert main(["doctor", str(tmp_path / "absent")]) == 2
    assert "absent: no such dataset or folder" in capsys.readouterr().err
    assert main(["doctor", "--batch-size", "0"]) == 2
    assert "--batch-size 0: must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("io_depth", [None, 0, 3])
def test_doctor_forecasts_a_cold_shuffled_epoch_from_a_measured_sample(image_tree, tmp_path, capsys, monkeypatch,
                                                                       io_depth):
    from pixfeed.packers import pack

    pack(image_tree, tmp_path / "ds", "mmap", size=16)
    if io_depth is not None:  # read ahead as make_loader would: WILLNEED, or threads where it is ignored
        monkeypatch.setattr(storage, "choose_io_depth", lambda path: (io_depth, "given"))
    finding = storage.check_epoch(tmp_path / "ds")
    d = finding.data
    assert finding.check == "cold epoch" and d["path"].endswith("images.npy") and d["io_depth_reason"]
    assert io_depth is None or d["io_depth"] == io_depth
    assert d["sample_bytes"] > 0 and d["sample_records"] >= 1 and d["sequential_bytes"] > 0
    assert d["bytes_per_s"] == d["sample_bytes"] / d["sample_seconds"]  # the line is built from what was read
    assert d["images_per_s"] == d["bytes_per_s"] / d["bytes_per_record"] and d["bytes_per_record"] == 16 * 16 * 3
    assert d["fraction_of_sequential"] == d["bytes_per_s"] / d["sequential_bytes_per_s"]
    assert finding.value.startswith(f"a cold shuffled epoch of this dataset would read at about "
                                    f"{d['bytes_per_s'] / 1e6:.0f} MB/s ({d['images_per_s']:.0f} img/s), "
                                    f"{d['fraction_of_sequential']:.0%} of the sequential rate")
    assert "too little to judge" in finding.advice  # a few KiB of records
    if io_depth is not None:
        return
    assert main(["doctor", str(tmp_path / "ds"), "--json"]) == 0
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert "a cold shuffled epoch of this dataset would read at about" in found["cold epoch"]["value"]
    assert storage.check_epoch(image_tree) is None  # an image folder has no record byte ranges


@pytest.mark.parametrize("shuffled, status", [(300e6, "warn"), (900e6, "ok")])
def test_the_epoch_forecast_says_what_the_sample_and_sequential_read_gave(image_tree, tmp_path, monkeypatch,
                                                                          shuffled, status):
    from pixfeed.packers import pack

    pack(image_tree, tmp_path / "ds", "mmap", size=16)
    monkeypatch.setattr(storage, "sequential_rate", lambda files, depth, limit: {"bytes_per_s": 1e9, "bytes": 64 * MiB})
    monkeypatch.setattr(storage, "shuffled_sample", lambda extents, depth, nbytes, seconds: {
        "bytes": 32 * MiB, "seconds": 32 * MiB / shuffled, "bytes_per_s": shuffled, "records": 100})
    finding = storage.check_epoch(tmp_path / "ds")
    assert f"about {shuffled / 1e6:.0f} MB/s ({shuffled / 768:.0f} img/s), {shuffled / 1e9:.0%} of the sequential " \
           f"rate (1000 MB/s with " in finding.value
    assert finding.status == status and ("quasi_random" in finding.advice) == (status == "warn")
