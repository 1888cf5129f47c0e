"""What a batch looks like: make_loader's ``memory_format`` on every path (issue #42 item 3).

Batches are N x C x H x W in channels_last strides by default (the layout the pixels are stored in, and
the one convolutions on GPUs prefer); ``memory_format=torch.contiguous_format`` gives plain NCHW strides
on CPU batches too, in every format, with and without workers, with the same pixels."""
from __future__ import annotations

import pytest
import torch
from conftest import make_tree

import pixfeed
from pixfeed.errors import OptionError

CONTIGUOUS, CHANNELS_LAST = torch.contiguous_format, torch.channels_last


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    src = make_tree(root / "src")
    for fmt in ("mmap", "lmdb", "hdf5", "wds"):
        pixfeed.pack(src, root / fmt, fmt, workers=1)
    pixfeed.pack(src, root / "pixels", "mmap", store="pixels", size=16, workers=1)
    return root


def _batches(ds, memory_format=None, **options):
    given = {} if memory_format is None else {"memory_format": memory_format}
    return [b[0] for b in pixfeed.make_loader(ds, 4, shuffle=False, **given, **options)]


@pytest.mark.filterwarnings("ignore:.*DataLoader workers")
@pytest.mark.parametrize("name", ["mmap", "lmdb", "hdf5", "wds", "pixels"])
@pytest.mark.parametrize("workers", [0, 2])
def test_contiguous_format_gives_nchw_strides_and_the_same_pixels(packs, name, workers):
    crop = "center" if name == "pixels" else "random"
    ds = pixfeed.open_dataset(packs / name, size=12, crop=crop)
    default = _batches(ds, num_workers=workers)
    flat = _batches(ds, CONTIGUOUS, num_workers=workers)
    assert all(b.is_contiguous(memory_format=CHANNELS_LAST) for b in default)  # the default, as documented
    assert all(b.is_contiguous() for b in flat)
    assert [b.view(b.size(0), -1).shape for b in flat] == [(len(b), 3 * 12 * 12) for b in flat]
    assert all(torch.equal(a, b) for a, b in zip(default, flat)) and len(default) == len(flat) >= 3


def test_a_transform_a_users_dataset_and_fields_follow_memory_format_too(packs):
    def half(image):
        return image[:, ::2, ::2]

    transformed = pixfeed.open_dataset(packs / "mmap", size=12, transform=half)
    for workers in (0, 2):
        assert all(b.is_contiguous() for b in _batches(transformed, CONTIGUOUS, num_workers=workers))
        assert all(b.is_contiguous(memory_format=CHANNELS_LAST) for b in _batches(transformed, num_workers=workers))
    users = [(torch.full((3, 4, 5), i, dtype=torch.uint8), i) for i in range(8)]  # CHW contiguous samples
    assert all(b.is_contiguous(memory_format=CHANNELS_LAST) for b in _batches(users, num_workers=0))
    assert all(b.is_contiguous() for b in _batches(users, CONTIGUOUS, num_workers=0))
    fields = pixfeed.open_dataset(packs / "lmdb", size=12, fields=("label", "image"))  # collated per field
    for workers in (0, 2):
        batch = next(iter(pixfeed.make_loader(fields, 4, num_workers=workers, memory_format=CONTIGUOUS)))
        assert batch[1].is_contiguous() and batch[1].shape == (4, 3, 12, 12) and len(batch[0]) == 4


def test_memory_format_is_checked_and_the_plan_says_the_layout(packs):
    ds = pixfeed.open_dataset(packs / "mmap", size=12)
    with pytest.raises(OptionError, match="memory_format .*channels_last.*contiguous_format"):
        pixfeed.make_loader(ds, 4, memory_format=torch.preserve_format)
    with pytest.raises(OptionError, match="dtype shape batches on a device"):
        pixfeed.make_loader(ds, 4, dtype=torch.float32)  # converting stays the device stage's work
    assert "channels_last" in str(pixfeed.make_loader(ds, 4).pixfeed_plan)
    assert "contiguous_format" in str(pixfeed.make_loader(ds, 4, memory_format=CONTIGUOUS).pixfeed_plan)


def test_a_sample_is_a_chw_view_of_hwc_pixels_as_documented(packs):
    image, _ = pixfeed.open_dataset(packs / "mmap", size=12)[0]
    assert image.shape == (3, 12, 12) and image.stride()[0] == 1 and not image.is_contiguous()  # HWC strides
    assert image.contiguous().view(-1).shape == (3 * 12 * 12,)
