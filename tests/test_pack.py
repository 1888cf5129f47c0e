"""The pack pipeline and the mmap format (foundation contract)."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pixfeed
from pixfeed.datasets import MmapImageDataset
from pixfeed.errors import CorruptDataError, DatasetError, OptionError, SourceError
from pixfeed.packers import tasks
from pixfeed.sources.folder import scan

from conftest import fail_record_at, write_image, sized
from reference import reference_pixels

ROOT = Path(__file__).resolve().parents[1]


def files_of(root: Path) -> list:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_pixels_round_trip_matches_pillow_reference(image_tree, tmp_path):
    m = pixfeed.pack(image_tree, tmp_path / "ds", "mmap", size=24, workers=2)
    ds = MmapImageDataset(tmp_path / "ds")
    paths = files_of(image_tree)
    assert m["count"] == len(ds) == len(paths) == 12
    assert m["classes"] == ds.classes == ["cat", "dog", "eel"]
    assert m["shape"] == [24, 24, 3]
    for i, rel in enumerate(paths):
        image, label = ds[i]
        assert image.dtype == torch.uint8 and image.shape == (3, 24, 24)
        assert label == ["cat", "dog", "eel"].index(rel.split("/")[0])
        np.testing.assert_array_equal(image.permute(1, 2, 0).numpy(), reference_pixels(image_tree / rel, 24))
    keys = json.loads((tmp_path / "ds" / "keys.json").read_text())
    assert keys == [p.rsplit(".", 1)[0] for p in paths]


def test_encoded_bytes_identical_to_source(image_tree, tmp_path):
    pixfeed.pack(image_tree, tmp_path / "ds", "mmap", store="encoded", workers=2)
    data = (tmp_path / "ds" / "data.bin").read_bytes()
    offsets = np.load(tmp_path / "ds" / "offsets.npy")
    for i, rel in enumerate(files_of(image_tree)):
        assert data[offsets[i]:offsets[i + 1]] == (image_tree / rel).read_bytes()


def test_encoded_and_pixels_paths_give_the_same_pixels(image_tree, tmp_path):
    pixfeed.pack(image_tree, tmp_path / "px", "mmap", size=20)
    pixfeed.pack(image_tree, tmp_path / "enc", "mmap", store="encoded")
    px, enc = MmapImageDataset(tmp_path / "px"), MmapImageDataset(tmp_path / "enc", size=20, crop_ratio=1.0, exact=True)
    for i in range(len(px)):
        assert torch.equal(px[i][0], enc[i][0])


def test_output_loads_with_plain_numpy(image_tree, tmp_path):
    pixfeed.pack(image_tree, tmp_path / "ds", "mmap", size=16)
    images = np.load(tmp_path / "ds" / "images.npy", mmap_mode="r")
    labels = np.load(tmp_path / "ds" / "labels.npy", mmap_mode="r")
    assert images.shape == (12, 16, 16, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and list(labels) == [0] * 4 + [1] * 4 + [2] * 4


def test_flat_source(flat_tree, tmp_path):
    m = pixfeed.pack(flat_tree, tmp_path / "ds", "mmap", size=8)
    ds = MmapImageDataset(tmp_path / "ds")
    assert m["classes"] is None and ds.classes is None
    assert [ds[i][1] for i in range(len(ds))] == [-1] * 5


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "no such folder"),
    (lambda p: write_image(p / "file.jpg"), "is a file"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "no images"),
])
def test_bad_sources_get_clear_errors(tmp_path, make, message):
    src = make(tmp_path)
    with pytest.raises(SourceError, match=message):
        pixfeed.pack(src, tmp_path / "out", "mmap")
    assert not (tmp_path / "out").exists()


def test_hidden_files_and_other_extensions_are_skipped(tmp_path):
    src = tmp_path / "src"
    write_image(src / "a" / "x.JPG")
    write_image(src / "a" / ".hidden.jpg")
    write_image(src / ".cache" / "y.jpg")
    (src / "a" / "notes.txt").write_text("hi")
    m = pixfeed.pack(src, tmp_path / "ds", "mmap", size=8)
    assert json.loads((tmp_path / "ds" / "keys.json").read_text()) == ["a/x"] and m["classes"] == ["a"]
    with pytest.raises(SourceError, match="no images"):
        pixfeed.pack(src, tmp_path / "ds2", "mmap", ext="webp")


def test_existing_destination_needs_overwrite(image_tree, tmp_path):
    dst = tmp_path / "ds"
    pixfeed.pack(image_tree, dst, "mmap", size=8)
    with pytest.raises(OptionError, match="--overwrite"):
        pixfeed.pack(image_tree, dst, "mmap", size=8)
    pixfeed.pack(image_tree, dst, "mmap", size=12, overwrite=True)
    assert MmapImageDataset(dst)[0][0].shape == (3, 12, 12)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_overwrite_never_replaces_what_is_not_a_dataset(image_tree, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.tex").write_text("years of work")
    (tmp_path / "file.txt").write_text("a file")
    for dst, what in ((tmp_path / "notes", "not a pixfeed dataset"), (tmp_path / "file.txt", "is a file")):
        with pytest.raises(OptionError, match=f"{what}.*nothing was touched"):
            pixfeed.pack(image_tree, dst, "mmap", size=8, overwrite=True)
    assert (tmp_path / "notes" / "thesis.tex").read_text() == "years of work"
    assert (tmp_path / "file.txt").read_text() == "a file"
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "notes")
    for dst in (tmp_path / "empty", tmp_path / "link"):  # an empty folder; a link (only the link goes)
        pixfeed.pack(image_tree, dst, "mmap", size=8, overwrite=True)
        assert MmapImageDataset(dst)[0][0].shape == (3, 8, 8)
    assert (tmp_path / "notes" / "thesis.tex").read_text() == "years of work"


def test_destination_inside_the_source_is_refused(image_tree):
    for dst in (image_tree / "packed", image_tree / "cat" / "packed"):
        with pytest.raises(OptionError, match="is inside the source"):
            pixfeed.pack(image_tree, dst, "mmap", size=8, overwrite=True)
    with pytest.raises(OptionError, match="not a pixfeed dataset"):  # the source itself
        pixfeed.pack(image_tree, image_tree, "mmap", size=8, overwrite=True)
    assert not (image_tree / "packed").exists() and len(list(image_tree.rglob("*.*"))) == 12


def test_worker_failure_leaves_no_destination_and_keeps_old(image_tree, tmp_path, monkeypatch):
    dst = tmp_path / "ds"
    pixfeed.pack(image_tree, dst, "mmap", size=8)
    before = (dst / "pixfeed.json").read_bytes()
    fail_record_at(monkeypatch, 7)
    with pytest.raises(RuntimeError, match="disk on fire"):
        pixfeed.pack(image_tree, dst, "mmap", size=12, workers=2, overwrite=True)
    assert (dst / "pixfeed.json").read_bytes() == before
    with pytest.raises(RuntimeError):
        pixfeed.pack(image_tree, tmp_path / "new", "mmap", workers=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "src"]


def test_bad_image_fails_by_default_and_is_skipped_on_request(image_tree, tmp_path):
    bad = image_tree / "dog" / "broken.jpg"
    bad.write_bytes(b"this is not an image")
    with pytest.raises(SourceError, match="broken.jpg.*not a JPEG, PNG or WebP"):
        pixfeed.pack(image_tree, tmp_path / "ds", "mmap", size=8)
    assert not (tmp_path / "ds").exists()
    for store in ("pixels", "encoded"):
        m = pixfeed.pack(image_tree, tmp_path / store, "mmap", store=store, **sized(store, 8), on_error="skip", workers=2)
        assert m["count"] == 12 and [s["path"] for s in m["skipped"]] == ["dog/broken.jpg"]
        ds = MmapImageDataset(tmp_path / store, size=8)
        assert "dog/broken" not in json.loads((tmp_path / store / "keys.json").read_text())
        assert sorted(ds[i][1] for i in range(12)) == [0] * 4 + [1] * 4 + [2] * 4


def test_dataset_pickles_before_and_after_first_access(image_tree, tmp_path):
    pixfeed.pack(image_tree, tmp_path / "ds", "mmap", size=8)
    ds = MmapImageDataset(tmp_path / "ds")
    fresh = pickle.loads(pickle.dumps(ds))
    first = ds[3]
    used = pickle.loads(pickle.dumps(ds))
    assert used._handle is None
    for other in (fresh, used):
        assert torch.equal(other[3][0], first[0]) and other[3][1] == first[1]


def test_dataloader_with_two_workers_sees_every_index_once(image_tree, tmp_path):
    pixfeed.pack(image_tree, tmp_path / "ds", "mmap", size=8)
    ds = MmapImageDataset(tmp_path / "ds")
    expected = sorted(ds[i][0].numpy().tobytes() for i in range(len(ds)))
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, shuffle=True)
    seen = sorted(x.numpy().tobytes() for images, _ in loader for x in images)
    assert seen == expected and len(set(seen)) == len(ds)


@pytest.mark.parametrize("store", ["pixels", "encoded"])
def test_getitems_and_get_batch_equal_item_reads(image_tree, tmp_path, store):
    pixfeed.pack(image_tree, tmp_path / "ds", "mmap", store=store, **sized(store, 10))
    ds = MmapImageDataset(tmp_path / "ds", size=8)
    idx = [5, 0, 11, 5, -1]
    batch = ds.__getitems__(idx)
    images, labels = ds.get_batch(idx)
    for j, i in enumerate(idx):
        image, label = ds[i]
        assert torch.equal(batch[j][0], image) and batch[j][1] == label
        assert torch.equal(images[j], image) and labels[j] == label
    with pytest.raises(IndexError, match="index 12 out of range"):
        ds[12]


def test_flipped_byte_never_comes_back_as_pixels(image_tree, tmp_path):
    pixfeed.pack(image_tree, tmp_path / "ds", "mmap", size=8)
    path = tmp_path / "ds" / "images.npy"
    raw = bytearray(path.read_bytes())
    offset = len(raw) - 12 * 8 * 8 * 3 + 2 * 8 * 8 * 3 + 17  # a byte of record 2
    raw[offset] ^= 0x40
    path.write_bytes(bytes(raw))
    ds = MmapImageDataset(tmp_path / "ds")
    ds[1]
    with pytest.raises(CorruptDataError, match=r"record 2 \(key 'cat/img2'\).*checksum"):
        ds[2]
    with pytest.raises(CorruptDataError):
        ds.get_batch([0, 2])
    MmapImageDataset(tmp_path / "ds", checksums=False)[2]  # the opt-out reads without checking


def test_truncated_data_file_and_unknown_layout_are_refused(image_tree, tmp_path):
    pixfeed.pack(image_tree, tmp_path / "ds", "mmap", size=8)
    images = tmp_path / "ds" / "images.npy"
    images.write_bytes(images.read_bytes()[:-100])
    with pytest.raises(CorruptDataError, match="images.npy.*truncated"):
        MmapImageDataset(tmp_path / "ds")[0]
    manifest = tmp_path / "ds" / "pixfeed.json"
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**m, "layout_version": 99}))
    with pytest.raises(DatasetError, match="layout_version 99 is not supported"):
        pixfeed.open_dataset(tmp_path / "ds")
    with pytest.raises(DatasetError, match="not a pixfeed dataset"):
        pixfeed.open_dataset(tmp_path)


def test_cli_pack_script_and_info(image_tree, tmp_path):
    run = lambda *args: subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT)  # noqa: E731
    r = run("scripts/pack.py", "--format", "mmap", "--size", "8", "--workers", "1", str(image_tree), str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "packed 12 images" in r.stdout and "images/s" in r.stdout
    r = run("-m", "pixfeed.cli", "info", str(tmp_path / "a"))
    assert r.returncode == 0 and "records   12" in r.stdout and "cat, dog, eel" in r.stdout
    r = run("-m", "pixfeed.cli", "pack", "--format", "zip", str(image_tree), str(tmp_path / "b"))
    assert r.returncode == 2 and "invalid choice: 'zip'" in r.stderr
    r = run("-m", "pixfeed.cli", "pack", str(tmp_path / "nope"), str(tmp_path / "b"))
    assert r.returncode == 2 and "nope: no such folder" in r.stderr


def test_size_and_resize_modes(tmp_path):
    src = tmp_path / "src"
    write_image(src / "wide.png", size=(40, 10))
    for mode, check in [("pad", lambda a: a[:3].max() == 0 and a[8].max() > 0),
                        ("stretch", lambda a: a.shape == (16, 24, 3)),
                        ("crop", lambda a: a[0].max() > 0)]:
        pixfeed.pack(src, tmp_path / mode, "mmap", size="16x24", resize=mode)
        arr = MmapImageDataset(tmp_path / mode)[0][0].permute(1, 2, 0).numpy()
        assert arr.shape == (16, 24, 3) and check(arr), mode
    with pytest.raises(OptionError, match="size '0x3'"):
        pixfeed.pack(src, tmp_path / "bad", "mmap", size="0x3")


def test_packing_in_process_starts_no_thread_that_could_take_ctrl_c(image_tree, tmp_path, monkeypatch):
    """A SIGINT delivered to another thread (tqdm's monitor) left a read of a FIFO uninterrupted."""
    import threading

    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "monitor", None)  # as in a fresh process: a bar would start its monitor
    before, started = set(threading.enumerate()), []
    real = tasks.load_record

    def counting(*args):
        started.extend(t.name for t in threading.enumerate() if t not in before)
        return real(*args)

    monkeypatch.setattr(tasks, "load_record", counting)
    pixfeed.pack(image_tree, tmp_path / "ds", "mmap", size=8, workers=1, progress=True)
    assert started == [] and len(pixfeed.MmapImageDataset(tmp_path / "ds")) == len(scan(image_tree))
