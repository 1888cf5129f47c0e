"""make_loader(on_error="skip"): a record failing its checksum or decode is skipped, counted, named once,
and the count is in the plan and state_dict; "raise" stays the default (issue #42 item 13)."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from conftest import flip_stored, make_tree
from torch.utils.data import IterableDataset

import pixfeed
from pixfeed.errors import CorruptDataError, ImageDecodeError, OptionError

KEY = "dog/img1"  # record 5 of make_tree's 12 (an RGB PNG), label 1
MAP = ["mmap", "lmdb", "hdf5", "pixels"]


def _flip(root, dst):
    """One flipped byte in the middle of KEY's stored bytes (as test_verify does)."""
    if (dst / "images.npy").exists() and json.loads((dst / "pixfeed.json").read_text())["store"] == "pixels":
        pixels = np.load(dst / "images.npy", mmap_mode="r+")
        pixels[5, 3, 3, 0] ^= 0x40
        pixels.flush()
        return
    files = [dst / name for name in json.loads((dst / "pixfeed.json").read_text())["files"]]
    assert flip_stored(files, (root / "src" / f"{KEY}.png").read_bytes()) is not None, f"{KEY} not found in {dst}"


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    make_tree(root / "src")
    for name in ("mmap", "lmdb", "hdf5", "wds"):
        pixfeed.pack(root / "src", root / name, name, store="encoded", workers=1)
        _flip(root, root / name)
    pixfeed.pack(root / "src", root / "pixels", "mmap", store="pixels", size=16, workers=1)
    _flip(root, root / "pixels")
    return root


def _labels(loader):
    return [y.tolist() for _, y in loader]


@pytest.mark.parametrize("name", MAP)
def test_raise_stays_the_default(damaged, name):
    with pytest.raises(CorruptDataError, match=KEY):
        _labels(pixfeed.make_loader(pixfeed.open_dataset(damaged / name, size=16), 4, shuffle=False, num_workers=0))


@pytest.mark.parametrize("name", MAP)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_map_style_loader_reads_the_next_record_in_its_place(damaged, name, workers):
    ds = pixfeed.open_dataset(damaged / name, size=16, crop="random")
    loader = pixfeed.make_loader(ds, 4, shuffle=False, num_workers=workers, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # named once per process: checked below, in process
        epochs = [_labels(loader) for _ in range(2)]
    expected = [ds[i][1] for i in (0, 1, 2, 3, 4, 6, 6, 7, 8, 9, 10, 11)]  # record 6 read in 5's place
    assert epochs[0] == epochs[1] == [expected[0:4], expected[4:8], expected[8:12]] and len(loader) == 3
    assert loader.pixfeed_plan.skipped == 2 and loader.state_dict()["skipped"] == 2
    assert int((loader.pixfeed_plan.skips._named != 0).sum()) == 1  # named once, whichever worker met it
    assert "skipped            2" in str(loader.pixfeed_plan) and "on_error           skip" in str(loader.pixfeed_plan)


def test_each_damaged_record_is_named_once_and_the_count_survives_a_resume(damaged):
    ds = pixfeed.open_dataset(damaged / "lmdb", size=16)
    loader = pixfeed.make_loader(ds, 4, shuffle=False, num_workers=0, on_error="skip")
    with pytest.warns(RuntimeWarning, match=rf"skipped a damaged record .*{KEY}.*record 6 or the next sound one"):
        _labels(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = iter(loader)  # the second epoch: counted again, not named again
        next(batches), next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["skipped"] == 2 and loader.pixfeed_plan.reasons["on_error"].startswith("a record failing")
    again = pixfeed.make_loader(ds, 4, shuffle=False, num_workers=0, on_error="skip")
    again.load_state_dict(state)
    assert _labels(again) == [[2, 2, 2, 2]] and again.pixfeed_plan.skipped == 2


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.filterwarnings("ignore:.*DataLoader workers")
def test_a_wds_stream_leaves_the_damaged_record_out(damaged, workers):
    ds = pixfeed.open_dataset(damaged / "wds", size=16)
    with pytest.raises(CorruptDataError, match=KEY):  # in process: a traceback holding workers would wait for GC
        _labels(pixfeed.make_loader(ds, 4, num_workers=0))
    loader = pixfeed.make_loader(ds, 4, num_workers=workers, on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        labels = sorted(x for batch in _labels(loader) for x in batch)
    assert labels == sorted(ds_label for i, ds_label in enumerate([0] * 4 + [1] * 4 + [2] * 4) if i != 5)
    assert loader.pixfeed_plan.skipped == 1 and loader.state_dict()["skipped"] == 1
    assert pixfeed.make_loader(ds, 4, num_workers=0).pixfeed_plan.skips is None and ds.skips is None  # raise again


class Flaky(torch.utils.data.Dataset):
    """A user's dataset: index 3 does not decode, or every index fails its checksum."""

    def __init__(self, all_bad: bool = False) -> None:
        self.all_bad, self.reads = all_bad, 0

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i):
        self.reads += 1
        if self.all_bad:
            raise CorruptDataError(f"record {i}: checksum")
        if i == 3:
            raise ImageDecodeError(f"record {i}: truncated JPEG")
        return torch.zeros(3, 2, 2, dtype=torch.uint8), i


def test_a_decode_failure_is_skipped_and_a_dataset_damaged_throughout_still_raises():
    flaky = Flaky()
    loader = pixfeed.make_loader(flaky, 10, shuffle=False, num_workers=0, on_error="skip")
    with pytest.warns(RuntimeWarning, match="truncated JPEG"):
        first = next(iter(loader))[1].tolist()
    assert first == [0, 1, 2, 4, 4, 5, 6, 7, 8, 9]
    flaky.reads = 0
    assert next(iter(loader))[1].tolist() == first and flaky.reads == 10  # the replacement known: one read
    assert loader.pixfeed_plan.skipped == 2
    with pytest.raises(CorruptDataError, match="64 records in a row from record 0 are damaged"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            next(iter(pixfeed.make_loader(Flaky(all_bad=True), 10, shuffle=False, num_workers=0, on_error="skip")))


class Stream(IterableDataset):
    def __iter__(self):
        return iter([(torch.zeros(3, 2, 2), 0)])


def test_on_error_is_checked_by_name(damaged):
    ds = pixfeed.open_dataset(damaged / "mmap", size=16)
    with pytest.raises(OptionError, match="on_error 'ignore': expected 'raise'"):
        pixfeed.make_loader(ds, 4, on_error="ignore")
    with pytest.raises(OptionError, match="on_error='skip' and Stream"):
        pixfeed.make_loader(Stream(), 4, on_error="skip")
    with pytest.raises(OptionError, match="on_error and device"):
        pixfeed.make_loader(ds, 4, on_error="skip", device="cpu")
    assert "on_error           raise" in str(pixfeed.make_loader(ds, 4).pixfeed_plan)
