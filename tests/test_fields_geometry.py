"""Masks and boxes follow the image through every resize, crop and flip, in both store modes.

The images are solid blocks on grey (tests/fieldtree.py), so a mask can be
computed from the pixels read back: wherever a pixel is a pure block colour,
the mask read back must hold that block's label (a missed flip or an offset
crop disagrees on most of them).  Boxes are checked against a reference
written from torchvision's formulas (tests/reference.py), and against the
mask: the top block's box bounds its mask pixels.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import pixfeed
from fieldtree import COLOURS, FIELDS, make_field_tree, scene
from pixfeed.cli import main as cli
from pixfeed.seeds import Draws, uniforms
from reference import center_crop_box, resize_shape, rrc_params

N, OUT = 6, 40
GREY = np.array([90, 90, 90])


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = make_field_tree(tmp_path_factory.mktemp("geom"), N)
    out = {}
    for store in ("encoded", "pixels"):
        dst = root.parent / f"ds-{store}"
        size = ["--size", "64"] if store == "pixels" else []
        assert cli(["pack", "-q", "--workers", "1", "--format", "mmap", "--store", store, *size, "--index",
                    str(root / "index.csv"), "--class-column", "label", *FIELDS, str(root), str(dst)]) == 0
        out[store] = dst
    return out


def mask_from_pixels(image: np.ndarray):
    """(labels, pure): the block label of each pixel of a pure colour (grey is 0), and where that is."""
    palette = np.vstack([GREY, COLOURS]).astype(np.int64)
    diff = np.abs(image.astype(np.int64)[:, :, None, :] - palette[None, None]).max(-1)
    return diff.argmin(-1), diff.min(-1) <= 2


def check_aligned(image: torch.Tensor, mask: torch.Tensor) -> None:
    labels, pure = mask_from_pixels(image.permute(1, 2, 0).numpy())
    assert pure.mean() > 0.5
    assert np.array_equal(mask.numpy()[pure], labels[pure])


def check_top_box(mask: torch.Tensor, boxes: torch.Tensor, classes: torch.Tensor) -> None:
    """The last-drawn block is not covered by another: its box bounds its mask pixels (nearest: +-1 px)."""
    top = int(classes.max()) if len(classes) else None
    if top is None or top not in classes.tolist():
        return
    x0, y0, x1, y1 = boxes[classes.tolist().index(top)].tolist()
    ys, xs = np.nonzero(mask.numpy() == top + 1)
    assert len(xs) and xs.min() >= x0 - 1 and xs.max() + 1 <= x1 + 1 and ys.min() >= y0 - 1 and ys.max() + 1 <= y1 + 1


def through(boxes, box, scale, offset, out, flip):
    """Boxes minus the source box's origin, scaled, minus the center crop's offset, clipped to the
    output, flipped; empty ones dropped."""
    b = (np.array(boxes, np.float64).reshape(-1, 4) - [box[0], box[1]] * 2) * (scale * 2) - [*offset] * 2
    b = np.clip(b, 0, [out[1], out[0]] * 2)
    if flip:
        b[:, [0, 2]] = out[1] - b[:, [2, 0]]
    keep = (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])
    return b[keep], keep


def stored_boxes(i: int, store: str):
    """(boxes, classes, (w, h)) as stored: source boxes, or through the pack's Resize(64) + CenterCrop(64)."""
    _, mask, boxes, classes = scene(i)
    h, w = mask.shape
    if store == "encoded":
        return np.array(boxes, np.float64), np.array(classes), (w, h)
    rw, rh = resize_shape(w, h, 64)
    left, top, _, _ = center_crop_box(rw, rh, 64, 64)
    b, keep = through(boxes, (0, 0), [rw / w, rh / h], (left, top), (64, 64), False)
    return b, np.array(classes)[keep], (64, 64)


@pytest.mark.parametrize("store", ["encoded", "pixels"])
def test_center_crop(packed, store):
    ds = pixfeed.open_dataset(packed[store], fields=("image", "mask", "boxes", "box_cls"), size=OUT)
    for i in range(N):
        image, mask, boxes, classes = ds[i]
        assert image.shape == (3, OUT, OUT) and mask.shape == (OUT, OUT)
        check_aligned(image, mask)
        check_top_box(mask, boxes, classes)
        src, src_classes, (w, h) = stored_boxes(i, store)
        if store == "encoded":  # Resize(floor(40 / 0.875) = 45) + CenterCrop(40)
            rw, rh = resize_shape(w, h, 45)
        else:  # stored 64 x 64 pixels: CenterCrop(40) of them
            rw, rh = w, h
        left, top, _, _ = center_crop_box(rw, rh, OUT, OUT)
        want, keep = through(src, (0, 0), [rw / w, rh / h], (left, top), (OUT, OUT), False)
        assert np.allclose(boxes.numpy(), want, atol=1e-3) and classes.tolist() == src_classes[keep].tolist()


@pytest.mark.parametrize("store", ["encoded", "pixels"])
def test_random_crops_and_flips(packed, store):
    ds = pixfeed.open_dataset(packed[store], fields=("image", "mask", "boxes", "box_cls"), size=OUT, crop="random")
    flips = set()
    for seed in range(12):
        i = seed % N
        torch.manual_seed(seed)
        image, mask, boxes, classes = ds[i]
        check_aligned(image, mask)
        check_top_box(mask, boxes, classes)
        torch.manual_seed(seed)  # the reference draws what the dataset drew (pixfeed.seeds.crop_draws outside a
        # loader: keyed by a number from torch's RNG), in torchvision's order
        rng = Draws(uniforms(int(torch.randint(0, 2**62, ()).item()), 0, [i])[0])
        src, src_classes, (w, h) = stored_boxes(i, store)
        top, left, ch, cw = rrc_params(w, h, rng)
        flip = bool(rng.random() < 0.5)
        flips.add(flip)
        want, keep = through(src, (left, top), [OUT / cw, OUT / ch], (0, 0), (OUT, OUT), flip)
        assert np.allclose(boxes.numpy(), want, atol=1e-3) and classes.tolist() == src_classes[keep].tolist()
    assert flips == {True, False}


def test_without_the_mask_the_image_is_what_it_was(packed):
    """Asking for fields does not change the image's random draws."""
    plain = pixfeed.open_dataset(packed["encoded"], size=OUT, crop="random")
    fields = pixfeed.open_dataset(packed["encoded"], fields=("image", "mask"), size=OUT, crop="random")
    torch.manual_seed(3)
    a, _ = plain[2]
    torch.manual_seed(3)
    b, _ = fields[2]
    assert torch.equal(a, b)
