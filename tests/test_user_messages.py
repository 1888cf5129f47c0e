"""Messages that name real options and the real situation (issue: every path a user takes ends right):
the loader plan's read-ahead reason on a CPU-only machine, WebDataset workers over few shards, doctor
on a map-style dataset in a bucket, and a Ray address with no cluster behind it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from conftest import make_tree
from pixfeed.cli import main
from pixfeed.datasets import open_dataset
from pixfeed.loaders import make_loader
from pixfeed.packers import pack


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reason given on a machine without CUDA")
def test_read_ahead_reason_on_a_cpu_only_machine(image_tree, tmp_path):
    pack(image_tree, tmp_path / "ds", "mmap", size=8, workers=1)
    plan = make_loader(open_dataset(tmp_path / "ds"), 4).pixfeed_plan
    assert plan.read_ahead is False and "CUDA steps" not in plan.reasons["read_ahead"]
    assert plan.reasons["read_ahead"].startswith("off: no CUDA device, so the training step runs on these CPUs")


def test_wds_workers_pixfeed_chose_over_one_shard_raise_no_warning(image_tree, tmp_path):
    pack(image_tree, tmp_path / "wds", "wds", workers=1)  # 12 images: one shard, as every small default pack
    dataset = open_dataset(tmp_path / "wds", size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = make_loader(dataset, 4, num_workers="auto")
        seen = sum(len(labels) for _, labels in loader)
    assert seen == 12
    if loader.num_workers > 1:
        assert "read by every worker" in loader.pixfeed_plan.reasons["num_workers"]


def test_wds_workers_asked_for_over_one_shard_warn_at_the_callers_line(image_tree, tmp_path):
    pack(image_tree, tmp_path / "wds", "wds", workers=1)
    dataset = open_dataset(tmp_path / "wds", size=16)
    with pytest.warns(UserWarning, match=r"each rank reads 1 shard\(s\) with 2 DataLoader workers.*"
                                         r"make the loader with num_workers=1") as caught:
        make_loader(dataset, 4, num_workers=2)
    assert [Path(w.filename).name for w in caught] == [Path(__file__).name]  # the caller's line, not torch's
    assert dataset.warn_shared_shards is False  # the workers do not say it again


def test_doctor_on_a_map_style_bucket_dataset_advises_for_it(s3_server, tmp_path, capsys):
    src = make_tree(tmp_path / "src", per_class=2)
    url = "s3://pixfeed/doctor-mmap"
    pack(src, url, "mmap", size=32, workers=1, storage_options=s3_server.options, overwrite=True)
    opts = [f"--storage-option={k}={v}" for k, v in s3_server.options.items()]
    assert main(["doctor", url, "--json", *opts]) == 0
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)}
    assert "shards" not in found["storage"]["advice"]
    assert "copied to the node's cache when opened" in found["storage"]["advice"]
    shm = found["shared memory"]
    # stored pixels: center crops read in process, but random-crop training uses workers (#42 item 8): sized for them
    assert "random-crop training's" in shm["value"] and shm["data"]["need"] > 0, shm
    assert "no loader workers here" not in shm["advice"], shm


def test_ray_address_auto_without_a_cluster_is_named(tmp_path):
    src = make_tree(tmp_path / "src", per_class=1)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-m", "pixfeed.cli", "pack", str(src), str(tmp_path / "ds"), "--executor",
                           "ray", "--address", "auto", "-q"], capture_output=True, text=True, env=env, timeout=120)
    if "no Ray cluster answers there" not in done.stderr and done.returncode == 0:
        pytest.skip("a Ray cluster is running on this machine: 'auto' found it")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--address auto: no Ray cluster answers there (Could not find any running Ray instance); start one " \
           "with `ray start --head`" in done.stderr
    assert not (tmp_path / "ds").exists()
