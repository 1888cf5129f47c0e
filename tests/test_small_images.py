"""Images smaller than the stored size: kept at their own size when they all share it and no size is asked
for, else upscaled with a note saying how many, by how much, and what it cost (packers/sizes.py)."""
from __future__ import annotations

import numpy as np
from conftest import make_tree
from PIL import Image

import pixfeed
from pixfeed.cli import main
from pixfeed.packers import pack


def small_folder(root, sizes=((32, 32),) * 6):
    for i, (h, w) in enumerate(sizes):
        (root / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "ab"[i % 2] / f"{i}.png")
    return root


def test_images_of_one_small_size_are_stored_at_it_by_default(tmp_path):
    m = pack(small_folder(tmp_path / "src"), tmp_path / "ds", workers=1)
    assert m["shape"] == [32, 32, 3]  # not 256x256: 64x the pixels of nothing
    assert any("every image is 32x32, smaller than the default 256x256" in n for n in m["notes"]), m["notes"]
    ds = pixfeed.open_dataset(tmp_path / "ds")
    assert tuple(ds[0][0].shape) == (3, 32, 32)


def test_an_asked_size_upscales_and_the_report_says_how_much(tmp_path, capsys):
    src = small_folder(tmp_path / "src")
    assert main(["pack", str(src), str(tmp_path / "ds"), "--size", "256", "--workers", "2"]) == 0
    err = capsys.readouterr().err
    assert "note: 6 of 6 images were smaller than 256x256 and were upscaled to it (up to 8.0x a side; the pack " \
           "stores" in err and "--size S" in err
    m = pack(src, tmp_path / "ds64", size=64, workers=1)
    assert m["shape"] == [64, 64, 3] and any("upscaled to it (up to 2.0x a side" in n for n in m["notes"])


def test_small_images_of_several_sizes_are_upscaled_with_a_note(tmp_path):
    m = pack(small_folder(tmp_path / "src", [(32, 32), (40, 30)] * 2), tmp_path / "ds", workers=1)
    assert m["shape"] == [256, 256, 3]
    assert any("4 of 4 images were smaller than 256x256" in n and "up to 8.5x a side" in n for n in m["notes"])
    samples = [{"image": np.zeros((8, 8, 3), np.uint8), "label": 0}] * 2
    m = pixfeed.pack_samples(samples, tmp_path / "samples", size=16, workers=1)
    assert any("2 of 2 images were smaller than 16x16" in n for n in m["notes"]), m["notes"]


def test_images_larger_than_the_size_get_no_note(tmp_path):
    m = pack(make_tree(tmp_path / "src"), tmp_path / "ds", size=16, workers=1)
    assert not any("upscaled" in n or "own size" in n for n in m["notes"]), m["notes"]
    m = pack(make_tree(tmp_path / "src2"), tmp_path / "enc", "lmdb", workers=1)  # encoded: nothing resized
    assert not any("upscaled" in n for n in m["notes"])
