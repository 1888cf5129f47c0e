"""Random crops drawn once per batch from (seed, epoch, record index) (pixfeed.seeds.uniforms,
pixfeed.image.geometry.plans): the vectorised batch draw equals the per-sample one, follows
torchvision's RandomResizedCrop, and gives a record the same crop in every format and worker count."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from pixfeed.datasets import open_dataset
from pixfeed.image import geometry
from pixfeed.loaders import make_loader
from pixfeed.packers import pack
from pixfeed.seeds import DRAWS, Draws, seeded_by_index, uniforms
from conftest import write_image
from reference import rrc_params


def test_uniforms_are_a_function_of_seed_epoch_and_index():
    batch = uniforms(7, 2, [3, 11, 5])
    assert batch.shape == (3, DRAWS) and batch.dtype == np.float64
    np.testing.assert_array_equal(batch[1], uniforms(7, 2, [11])[0])  # not of the batch it came in
    assert not np.array_equal(batch[0], uniforms(7, 3, [3])[0])  # another epoch
    assert not np.array_equal(batch[0], uniforms(8, 2, [3])[0])  # another seed
    many = uniforms(0, 0, np.arange(20000))
    assert 0 <= many.min() and many.max() < 1
    assert abs(many.mean() - 0.5) < 0.01 and abs(many.var() - 1 / 12) < 0.005
    # neighbouring records and slots are not correlated
    assert abs(np.corrcoef(many[:-1, 0], many[1:, 0])[0, 1]) < 0.05
    assert abs(np.corrcoef(many[:, 0], many[:, 1])[0, 1]) < 0.05


def test_draws_hand_out_numbers_as_a_generator_does():
    d = Draws([0.25, 0.5, 0.75, 0.999])
    assert d.uniform(2.0, 4.0) == 2.5 and d.integers(0, 10) == 5 and d.integers(4) == 3 and d.random() == 0.999
    with pytest.raises(IndexError, match="random numbers are all used"):
        d.random()


def test_batch_plans_equal_per_sample_plans():
    rng = np.random.default_rng(0)
    w, h = rng.integers(1, 2000, 3000), rng.integers(1, 2000, 3000)
    w[:300], h[300:600] = rng.integers(1, 20, 300), rng.integers(1, 20, 300)  # extreme aspects: fallbacks
    draws = uniforms(1, 0, np.arange(3000))
    batch = geometry.plans(w, h, (24, 20), "random", draws)
    one = [geometry.plan(int(a), int(b), (24, 20), crop="random", rng=Draws(d)) for a, b, d in zip(w, h, draws)]
    assert list(batch) == one
    center = geometry.plans(w, h, (24, 20), "center", crop_ratio=0.875)
    assert list(center) == [geometry.plan(int(a), int(b), (24, 20), crop_ratio=0.875) for a, b in zip(w, h)]
    assert list(geometry.Plans.of(one)) == one


def test_boxes_follow_torchvision_random_resized_crop():
    """Scale and ratio bounds, the fallback for extreme aspects, and the distribution of area, aspect,
    position and fallbacks against torchvision's get_params (tests/reference.py, from its formulas, its
    draws from an independent generator), with wide margins."""
    n, (w, h) = 4000, (500, 375)
    boxes, flips = geometry.random_boxes(w, h, uniforms(3, 0, np.arange(n)))
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all()
    area, aspect = bw * bh / (w * h), bw / bh
    assert area.min() >= 0.08 - 0.01 and area.max() <= 1
    assert aspect.min() >= 0.75 * 0.97 and aspect.max() <= 4 / 3 * 1.03
    assert 0.45 < flips.mean() < 0.55
    rng = np.random.default_rng(0)
    ref = np.array([rrc_params(w, h, rng) for _ in range(n)])  # (top, left, height, width)
    ref_area, ref_aspect = ref[:, 2] * ref[:, 3] / (w * h), ref[:, 3] / ref[:, 2]
    assert abs(area.mean() - ref_area.mean()) < 0.03 and abs(area.std() - ref_area.std()) < 0.03
    assert abs(np.log(aspect).mean() - np.log(ref_aspect).mean()) < 0.03
    assert abs((boxes[:, 0] + bw / 2).mean() / w - (ref[:, 1] + ref[:, 3] / 2).mean() / w) < 0.03
    # 600 x 60: most tries fail; as often wholly as torchvision's
    boxes, _ = geometry.random_boxes(600, 60, uniforms(3, 0, np.arange(n)))
    fallback = (boxes == [(600 - 80) // 2, 0, (600 - 80) // 2 + 80, 60]).all(1).mean()
    ref = np.array([rrc_params(600, 60, rng) for _ in range(n)])
    ref_fallback = ((ref[:, 2] == 60) & (ref[:, 3] == 80) & (ref[:, 1] == 260)).mean()
    assert 0.05 < ref_fallback and abs(fallback - ref_fallback) < 0.05
    # no try fits a 1000 x 10 image: the largest center box within the ratio bounds
    boxes, _ = geometry.random_boxes(1000, 10, uniforms(3, 0, np.arange(50)))
    assert (boxes == [493, 0, 506, 10]).all()  # width round(10 * 4/3) = 13, centred: floor(987 / 2)


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("draws")
    for i, size in enumerate([(61, 47), (47, 61), (90, 30), (33, 33), (120, 80), (40, 52)] * 2):
        write_image(root / "src" / f"c{i % 2}" / f"{i:02d}.jpg", size=size, seed=i)
    for fmt in ("mmap", "lmdb", "hdf5", "wds"):
        order = {"shuffle": False} if fmt == "wds" else {}  # wds packs shuffle records by default
        pack(root / "src", root / fmt, fmt, store="encoded", workers=1, **order)
    pack(root / "src", root / "pix", "mmap", store="pixels", size=48, workers=1)
    pack(root / "src", root / "pixwds", "wds", store="pixels", size=48, workers=1, shuffle=False)  # same record order
    return root


def _epoch(path, epoch: int, workers: int = 0, batch: int = 4) -> torch.Tensor:
    ds = open_dataset(path, size=24, crop="random")
    loader = make_loader(ds, batch, shuffle=False, seed=5, num_workers=workers)
    loader.set_epoch(epoch)
    return torch.cat([b[0] for b in loader])


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5", "wds"])
def test_a_record_gets_the_same_crop_in_every_format(packs, fmt):
    want = _epoch(packs / "mmap", 1)
    np.testing.assert_array_equal(_epoch(packs / fmt, 1).numpy(), want.numpy())
    assert not torch.equal(_epoch(packs / fmt, 2), want)  # another epoch, other crops


def test_stored_pixels_get_the_same_crop_in_every_format_worker_count_and_batch_size(packs):
    want = _epoch(packs / "pix", 3)
    np.testing.assert_array_equal(_epoch(packs / "pixwds", 3).numpy(), want.numpy())
    np.testing.assert_array_equal(_epoch(packs / "pix", 3, workers=2, batch=5).numpy(), want.numpy())


def test_a_dataset_read_alone_draws_per_batch_like_the_loader(packs):
    ds = open_dataset(packs / "mmap", size=24, crop="random")
    with seeded_by_index(5, 1):
        got = torch.stack([x for x, _ in ds.__getitems__(list(range(len(ds))))])
        one = ds[3][0]
        batch = ds.get_batch(list(range(len(ds))))[0]
    np.testing.assert_array_equal(got.numpy(), _epoch(packs / "mmap", 1).numpy())
    np.testing.assert_array_equal(one.numpy(), got[3].numpy())
    np.testing.assert_array_equal(batch.numpy(), got.numpy())
