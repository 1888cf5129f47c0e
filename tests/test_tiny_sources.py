"""Edge-sized sources over every format and store: one image, and two
byte-identical images (equal-length records, which h5py once collapsed into a
2-D array: "Can't broadcast (1, n) -> (1,)")."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import write_image, sized
from reference import reference_pixels

import pixfeed.registry
from pixfeed.datasets import open_dataset
from pixfeed.packers import pack

SIZE = 16


def one_image(root: Path) -> Path:
    write_image(root / "only" / "a.jpg", size=(40, 30), fmt="JPEG")
    return root


def twin_images(root: Path) -> Path:
    one_image(root)
    shutil.copy(root / "only" / "a.jpg", root / "only" / "b.jpg")
    return root


@pytest.mark.parametrize("make", [one_image, twin_images])
@pytest.mark.parametrize("store", ["pixels", "encoded"])
@pytest.mark.parametrize("fmt", sorted(pixfeed.registry.FORMATS))
def test_tiny_source_round_trips(tmp_path, fmt, store, make):
    src = make(tmp_path / "src")
    m = pack(src, tmp_path / "out", fmt, store=store, **sized(store, SIZE), workers=2)
    options = {"shuffle": False} if fmt == "wds" else {}
    ds = open_dataset(tmp_path / "out", size=SIZE, exact=True, **options)
    samples = list(ds)
    count = len(list(src.rglob("*.jpg")))
    assert m["count"] == len(ds) == len(samples) == count
    # encoded records: the default crop_ratio 224/256, Resize(floor(S * 256 / 224)) + CenterCrop(S)
    want = reference_pixels(src / "only" / "a.jpg", SIZE, SIZE if store == "pixels" else SIZE * 256 // 224)
    for img, label in samples:
        assert label == 0
        np.testing.assert_array_equal(img.permute(1, 2, 0).numpy(), want)
