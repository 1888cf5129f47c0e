"""Geometry matches torchvision's formulas (tests/reference.py, written from them):
Resize(floor(S / crop_ratio)) + CenterCrop(S) and RandomResizedCrop + flip; the exact
path pixel-identical to Pillow with that geometry, the fast path within 35 dB."""
from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

import pixfeed
from pixfeed.image.decode import decode
from pixfeed.errors import OptionError
from pixfeed.image.geometry import plan
from conftest import write_image
from reference import (center_crop_box, reference_pixels, reference_rgb, resize_shape, rrc_params,
                       tv_center_crop, tv_random_resized_crop_flip)

# (W, H) of odd sizes in both orientations; output S; torchvision Resize target R
CASES = [((101, 75), 32, 37), ((75, 101), 32, 37), ((97, 131), 28, 32), ((131, 97), 28, 32),
         ((203, 151), 48, 48), ((151, 203), 48, 48), ((64, 64), 56, 64), ((257, 89), 33, 37)]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def test_cases_catch_floored_offsets_and_rounded_long_sides():
    """The cases below must tell torchvision's rounding apart from the naive one."""
    floored = rounded = 0
    for (w, h), s, r in CASES:
        rw, rh = resize_shape(w, h, r)
        floored += center_crop_box(rw, rh, s, s)[:2] != ((rw - s) // 2, (rh - s) // 2)
        rounded += round(r * max(w, h) / min(w, h)) != max(rw, rh)
    assert floored >= 2 and rounded >= 2


@pytest.mark.parametrize("w", range(20, 90, 7))
@pytest.mark.parametrize("h", range(20, 90, 11))
@pytest.mark.parametrize("s,ratio,r", [(16, 1.0, 16), (16, 0.875, 18), (14, 0.875, 16), (21, 224 / 256, 24),
                                      (16, 0.9, 17)])  # floor(16 / 0.9 = 17.8)
def test_center_plan_is_resize_then_center_crop(w, h, s, ratio, r):
    p = plan(w, h, (s, s), crop_ratio=ratio)
    rw, rh = resize_shape(w, h, r)
    assert p.scaled == (rw, rh) and p.box is None
    assert p.offset == center_crop_box(rw, rh, s, s)[:2]


def test_random_plan_draws_torchvision_boxes():
    for seed in range(200):
        w, h = 30 + seed % 53, 200 - seed % 71
        r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
        p = plan(w, h, (24, 24), crop="random", rng=r1)
        i, j, ch, cw = rrc_params(w, h, r2)
        assert (p.box, p.flip) == ((j, i, j + cw, i + ch), bool(r2.random() < 0.5))
        assert r1.random() == r2.random()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0][0]}x{c[0][1]}-{c[1]}")
def test_center_crop_exact_and_fast(tmp_path, case):
    (w, h), s, r = case
    path = write_image(tmp_path / "a.jpg", size=(w, h), seed=w)
    data = path.read_bytes()
    want = reference_pixels(path, s, r)
    exact = decode(data, size=(s, s), crop_ratio=s / r, exact=True)
    np.testing.assert_array_equal(exact, want)
    assert psnr(decode(data, size=(s, s), crop_ratio=s / r), want) >= 35


def test_default_crop_ratio_is_resize_256_center_crop_224(tmp_path):
    path = write_image(tmp_path / "a.jpg", size=(301, 227), seed=3)
    exact = decode(path.read_bytes(), size=(224, 224), exact=True)
    np.testing.assert_array_equal(exact, reference_pixels(path, 224, 256))


@pytest.mark.parametrize("size", [(101, 75), (75, 101), (64, 64)])
def test_random_crop_exact_and_fast(tmp_path, size):
    path = write_image(tmp_path / "a.png", size=size, seed=5, fmt="PNG")
    data = path.read_bytes()
    r1, r2, r3 = (np.random.default_rng(11) for _ in range(3))
    for _ in range(8):
        want = np.asarray(tv_random_resized_crop_flip(reference_rgb(path), 24, 20, r1))
        np.testing.assert_array_equal(decode(data, size=(24, 20), crop="random", rng=r2, exact=True), want)
        assert psnr(decode(data, size=(24, 20), crop="random", rng=r3), want) >= 35


@pytest.mark.parametrize("bad", [0, 1.5, -0.5, "0.875", True])
def test_crop_ratio_is_checked(bad):
    with pytest.raises(OptionError, match="crop_ratio"):
        decode(b"", size=(8, 8), crop_ratio=bad)


def test_datasets_crop_stored_pixels_and_encoded_records_alike(tmp_path):
    """Stored pixels read at a smaller size are CenterCrop'ed with torchvision's offsets;
    encoded records take crop_ratio; crop_ratio on stored pixels is refused."""
    src = tmp_path / "src"
    for i, size in enumerate([(101, 75), (75, 101)]):
        write_image(src / "c" / f"{i}.jpg", size=size, seed=i)
    pixfeed.pack(src, tmp_path / "px", "mmap", size="27x31", workers=1)  # margins 3 and 7: round != floor
    pixfeed.pack(src, tmp_path / "enc", "mmap", store="encoded", workers=1)
    stored = pixfeed.open_dataset(tmp_path / "px")
    cropped = pixfeed.open_dataset(tmp_path / "px", size="24x24")
    encoded = pixfeed.open_dataset(tmp_path / "enc", size="28x28", crop_ratio=28 / 32, exact=True)
    for i in range(2):
        img = Image.fromarray(stored[i][0].permute(1, 2, 0).numpy())
        np.testing.assert_array_equal(cropped[i][0].permute(1, 2, 0).numpy(), np.asarray(tv_center_crop(img, 24, 24)))
        want = reference_pixels(src / "c" / f"{i}.jpg", 28, 32)
        np.testing.assert_array_equal(encoded[i][0].permute(1, 2, 0).numpy(), want)
    with pytest.raises(OptionError, match="crop_ratio applies to encoded records"):
        pixfeed.open_dataset(tmp_path / "px", size=24, crop_ratio=0.875)
