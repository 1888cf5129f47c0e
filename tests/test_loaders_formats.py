"""make_loader over every packed format: the path it takes, and exact coverage of an epoch."""
from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch
from torch.utils.data import IterableDataset

from conftest import make_tree
from pixfeed.errors import OptionError
from pixfeed.loaders import make_loader
from pixfeed.packers import pack
from pixfeed.registry import FORMATS
from pixfeed.datasets import open_dataset

SIZE = 16
Packed = Dict[str, Tuple[str, dict]]


def pack_all(root: Path) -> Packed:
    """Every available format in both stores: name -> (path, open_dataset options)."""
    src = make_tree(root / "src", per_class=11)  # 33 images: an odd count, so ranks need padding, and
    # enough per worker that two epochs of one order by chance (1 in 8! squared) never fail a test
    packed: Packed = {}
    for fmt in FORMATS:
        for store in ("pixels", "encoded"):
            dst = root / f"{fmt}-{store}"
            try:
                pack(src, dst, fmt, store=store, size=SIZE, workers=1)
            except OptionError:  # a format without this store
                continue
            packed[dst.name] = (str(dst), {} if store == "pixels" else {"size": SIZE})
    return packed


def identities(images: torch.Tensor) -> List[str]:
    return [hashlib.blake2b(image.contiguous().numpy().tobytes(), digest_size=8).hexdigest() for image in images]


def all_identities(dataset) -> Counter:
    samples = dataset if isinstance(dataset, IterableDataset) else (dataset[i] for i in range(len(dataset)))
    return Counter(identities(torch.stack([image for image, _ in samples])))


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Packed:
    return pack_all(tmp_path_factory.mktemp("formats"))


def test_formats_were_packed(packed):
    assert {"mmap-pixels", "mmap-encoded"} <= set(packed)


def test_epoch_covers_every_sample_once(packed):
    for name, (path, options) in packed.items():
        check_epoch(name, open_dataset(path, **options))


def check_epoch(name, dataset):
    loader = make_loader(dataset, 4)
    plan = loader.pixfeed_plan
    if plan.path != "iterable":
        assert plan.path == "batch", name
        assert plan.num_workers == (0 if name.endswith("pixels") else plan.cpus - (plan.cpus > 2)), name
    seen = Counter()
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE, SIZE) and labels.dtype == torch.int64, name
        seen.update(identities(images))
    assert seen == all_identities(dataset), name


def test_pixels_batches_match_single_reads(packed):
    dataset = open_dataset(packed["mmap-pixels"][0])
    images, labels = next(iter(make_loader(dataset, 5, shuffle=False)))
    for i in range(5):
        assert torch.equal(images[i], dataset[i][0]) and int(labels[i]) == dataset[i][1]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_encoded_images_of_different_sizes_are_refused_before_any_worker(packed, fmt):
    path, _ = packed[f"{fmt}-encoded"]
    with pytest.raises(OptionError, match="different sizes and cannot be batched; open it with size="):
        make_loader(open_dataset(path), 4)
    assert len(make_loader(open_dataset(path), 1, num_workers=0)) == 33  # one image a batch needs no size
    make_loader(open_dataset(path, transform=lambda x: x[:, :4, :4]), 4)  # a transform may make one shape
