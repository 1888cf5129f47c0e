"""Every advice rule of the stall profiler, with and without its condition: nothing already in use is advised."""
from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import pixfeed
from pixfeed.image import jpeghead as _jpeghead
from pixfeed.diagnose import advice
from pixfeed.diagnose.advice import InUse
from pixfeed.diagnose.report import StallReport, Step
from pixfeed.loaders._testing import ArrayDataset, random_images

ENCODED = InUse(store="encoded", workers=1, cpus=2)


@pytest.mark.parametrize("rule, offered, withheld, text", [
    (advice.more_workers, ENCODED, InUse(store="encoded", workers=2, cpus=2), "more workers"),
    (advice.more_workers, ENCODED, InUse(store="pixels", cpu_bound=False, workers=0, cpus=2), "more workers"),
    (advice.more_workers, ENCODED, InUse(store="encoded", workers=0, cpus=2, tuned=True), "more workers"),
    (advice.pixels_pack, ENCODED, InUse(store="pixels"), "--store pixels"),
    (advice.max_side, ENCODED, InUse(store="encoded", max_side=384), "--max-side"),
    (advice.max_side, ENCODED, InUse(store="pixels"), "--max-side"),
    (advice.fast_decode, InUse(store="encoded", fast_decode=False), ENCODED, "pixfeed[fast]"),
    (advice.fast_decode, InUse(store="encoded", exact=True), ENCODED, "exact=False"),
    (advice.fast_decode, InUse(store="encoded", fast_decode=False), InUse(store="pixels", fast_decode=False),
     "pixfeed[fast]"),
    (advice.batch_reads, InUse(batch_path=False), InUse(batch_path=True), "whole batches"),
    (advice.faster_storage, InUse(cached=0.3), InUse(cached=1.0), "faster storage"),  # every page cached already
])
def test_rule_offers_only_what_is_not_in_use(rule, offered, withheld, text):
    assert text in rule(offered)
    assert rule(withheld) is None


def test_copy_advice_pins_only_when_not_pinned():
    assert "pin_memory=True" in advice.for_copy(12, InUse(pin_memory=False))
    pinned = advice.for_copy(12, InUse(pin_memory=True))
    assert "pin_memory=True" not in pinned and "DevicePrefetcher" in pinned


def test_decode_advice_with_fast_decode_installed_says_it_is_in_use():
    text = advice.for_stage("decode", InUse(store="encoded", workers=2, cpus=2, fast_decode=True))
    assert "pixfeed[fast]" not in text and "more workers" not in text
    assert "fast decode (simplejpeg)" in text and "2 workers on 2 usable CPUs" in text


def test_nothing_left_to_advise_says_so():
    text = advice.for_stage("collate", InUse(store="pixels", cpu_bound=False, cpus=2, batch_path=True))
    assert "remedies are in use" in text and "reads in the training process" in text


def test_in_use_of_a_pixfeed_loader(image_tree, tmp_path, monkeypatch):
    from pixfeed.packers import pack

    pack(image_tree, tmp_path / "ds", "lmdb", max_side=32)
    monkeypatch.setattr(_jpeghead, "simplejpeg", None)
    loader = pixfeed.make_loader(pixfeed.open_dataset(tmp_path / "ds", size=16), 4, num_workers=0)
    u = InUse.of(loader)
    assert (u.store, u.max_side, u.fast_decode, u.workers, u.batch_path) == ("encoded", 32, False, 0, True)
    assert u.cpus == loader.pixfeed_plan.cpus and u.cpu_bound


def test_report_advice_follows_in_use():
    steps = [Step(wait=0.03, transfer=0.0, compute=0.01, images=8)] * 2
    stages = {"read": 0.0, "decode": 0.01, "transform": 0.0, "collate": 0.0, "other": 0.0}
    bare = StallReport(steps, stages, InUse(store="encoded", fast_decode=False, workers=1, cpus=2))
    assert "pixfeed[fast]" in bare.advice()[0] and "more workers" in bare.advice()[0]
    full = StallReport(steps, stages, InUse(store="encoded", max_side=384, workers=2, cpus=2))
    assert "pixfeed[fast]" not in full.advice()[0] and "pack with --max-side" not in full.advice()[0]


def test_no_measured_batch_gives_no_verdict():
    report = pixfeed.profile_loader(DataLoader(ArrayDataset(random_images(3)), batch_size=4, drop_last=True),
                                    steps=3, device=None)
    assert report.bound == "unmeasured" and report.advice() == [] and report.to_dict()["steps"] == 0
    assert "compute-bound" not in str(report) and "no batch was measured" in str(report)


def test_a_small_dataset_is_measured_over_several_epochs():
    loader = DataLoader(ArrayDataset(random_images(6)), batch_size=4)  # 2 batches an epoch
    report = pixfeed.profile_loader(loader, steps=5, device=None)
    assert len(report.steps) == 5 and report.epochs == 3 and report.to_dict()["images"] > 0


def test_reads_of_a_dataset_in_the_page_cache_are_not_sent_to_faster_storage(image_tree, tmp_path):
    from pixfeed.packers import pack
    from pixfeed.storage.pagecache import read_rate

    pack(image_tree, tmp_path / "ds", "mmap", size=16)
    loader = pixfeed.make_loader(pixfeed.open_dataset(tmp_path / "ds"), 4, num_workers=0)
    read_rate([tmp_path / "ds" / name for name in loader.dataset.dataset.manifest["files"]], cold=False)
    in_use = InUse.of(loader)
    if in_use.cached is None:
        pytest.skip("mincore cannot tell page residency here")
    assert in_use.in_page_cache  # every page was just read
    line = advice.for_stage("read", in_use)
    assert "faster storage" not in line and "every page of the dataset in the page cache" in line
