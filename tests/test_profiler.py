"""The stall profiler: a slow dataset is input-bound, a slow step compute-bound, and the wait is split by stage."""
from __future__ import annotations

import json
import re
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import pixfeed
from pixfeed.cli import main
from pixfeed.diagnose.report import StallReport, Step
from pixfeed.diagnose.stages import sample_stages
from pixfeed.errors import OptionError
from pixfeed.loaders._testing import ArrayDataset, random_images

DELAY = 0.03  # deliberately slow: 30 ms against well under 1 ms of real work


class SlowDataset(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(DELAY / 4)  # 4 samples per batch: 30 ms per batch
        return torch.zeros(3, 4, 4, dtype=torch.uint8), i


def sleep_step(batch):
    time.sleep(DELAY)


def test_slow_dataset_is_input_bound():
    report = pixfeed.profile_loader(DataLoader(SlowDataset(), batch_size=4), steps=4, device=None, stage_batches=1)
    assert report.bound == "input-bound" and report.stall_fraction > 0.8
    assert len(report.steps) == 4 and report.total("images") == 16
    assert report.dominant == "other"  # no pixfeed stage hooks: the whole __getitem__


def test_slow_step_is_compute_bound():
    loader = DataLoader(ArrayDataset(random_images(64)), batch_size=4)
    report = pixfeed.profile_loader(loader, steps=4, step_fn=sleep_step, device=None)
    assert report.bound == "compute-bound" and report.stall_fraction < 0.1
    assert report.per_batch()["compute"] >= DELAY
    assert "compute-bound" in str(report)


def test_meter_around_a_loop_that_breaks_early():
    with pixfeed.StallMeter() as meter:
        for i, batch in enumerate(meter.iter(DataLoader(SlowDataset(), batch_size=4))):
            batch = meter.to_device(batch, "cpu")
            if i == 2:
                break
    report = meter.report()
    assert len(report.steps) == 3 and report.bound == "input-bound"
    assert all(step.wait >= DELAY * 0.9 for step in report.steps)


def test_slow_transform_dominates_a_pixfeed_dataset(image_tree, tmp_path):
    from pixfeed.packers import pack

    pack(image_tree, tmp_path / "ds", "mmap", store="encoded")

    def slow_transform(image):
        time.sleep(DELAY)
        return image

    dataset = pixfeed.open_dataset(tmp_path / "ds", slow_transform, size=16)
    stages = sample_stages(DataLoader(dataset, batch_size=4), batches=1)
    assert stages["transform"] >= 4 * DELAY * 0.9
    assert stages["transform"] > 2 * (stages["read"] + stages["decode"] + stages["collate"])
    report = pixfeed.profile_loader(pixfeed.make_loader(dataset, 4, num_workers=0), steps=2, device=None)
    assert report.dominant == "transform" and "GPU" in report.advice()[0]


def test_stage_split_and_slow_copy_advice():
    steps = [Step(wait=0.02, transfer=0.012, compute=0.008, images=8)] * 2
    report = StallReport(steps, {"read": 0.001, "decode": 0.003, "transform": 0.0, "collate": 0.0, "other": 0.0})
    assert report.stall_fraction == pytest.approx(0.5)
    assert report.per_batch()["decode"] == pytest.approx(0.015) and report.per_batch()["read"] == pytest.approx(0.005)
    assert report.images_per_s == pytest.approx(16 / 0.08)
    assert report.dominant == "decode" and report.advice()[0].startswith("decoding dominates")
    assert "12 ms per batch" in report.advice()[1] and "pin_memory=True" in report.advice()[1]
    assert json.dumps(report.to_dict())


def test_fast_copy_gets_no_pinned_advice():
    report = StallReport([Step(wait=0.0, transfer=0.001, compute=0.05, images=8)])
    assert not any("pin_memory" in note for note in report.advice())


def test_bad_steps():
    with pytest.raises(OptionError, match="steps must be an integer >= 1"):
        pixfeed.profile_loader([], steps=0)


def test_cli_profile(image_tree, tmp_path, capsys):
    from pixfeed.packers import pack

    pack(image_tree, tmp_path / "ds", "mmap", size=16)
    assert main(["profile", str(tmp_path / "ds"), "--batch-size", "4", "--steps", "2", "--step-ms", "300", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["report"]["bound"] == "compute-bound" and out["report"]["steps"] == 2
    assert out["plan"]["num_workers"]


def test_cli_profile_without_a_step_gives_the_loaders_rate_not_a_verdict(image_tree, tmp_path, capsys):
    from pixfeed.packers import pack

    pack(image_tree, tmp_path / "ds", "mmap", size=16)
    assert main(["profile", str(tmp_path / "ds"), "--batch-size", "4", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "input-bound" not in out and "waiting for data 99%" not in out  # by construction without a step
    assert re.search(r"loader only: the loader alone delivers \d+ images/s, a batch every [\d.]+ ms", out)
    assert "--step-ms MS, your step's time, says whether training would wait" in out
    assert main(["profile", str(tmp_path / "ds"), "--batch-size", "4", "--steps", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["report"]["bound"] == "loader only"


@pytest.mark.parametrize("fmt", ["mmap", "lmdb", "hdf5", "wds"])
def test_cli_profile_defaults_on_mixed_sizes(fmt, image_tree, tmp_path, capsys):
    from pixfeed.packers import pack

    pack(image_tree, tmp_path / "ds", fmt, store="encoded")  # 12 images of 6 sizes: one batch an epoch
    assert main(["profile", str(tmp_path / "ds"), "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "images at 224x224 (center crop, the default for images of different sizes" in out
    assert re.search(r"in 3 measured batches over [234] epochs", out)  # wds: one batch per worker an epoch


def test_cli_profile_json_states_size_and_measures_steps(image_tree, tmp_path, capsys):
    from pixfeed.packers import pack

    pack(image_tree, tmp_path / "ds", "mmap", store="encoded")
    assert main(["profile", str(tmp_path / "ds"), "--size", "24", "--steps", "2", "--workers", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["size"] == [24, 24] and out["size_chosen"].startswith("--size")
    assert out["report"]["steps"] == 2 and out["report"]["images"] == 24 and out["report"]["epochs"] == 3


def test_cli_profile_names_the_bad_option(tmp_path, capsys):
    assert main(["profile", str(tmp_path), "--steps", "0"]) == 2
    assert "--steps 0: must be at least 1" in capsys.readouterr().err
