"""make_loader over every packed format: the path it takes, and exact coverage of an epoch."""
from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

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
    src = make_tree(root / "src", per_class=5)  # 15 images: an odd count, so ranks need padding
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
    return Counter(identities(torch.stack([image for image, _ in (dataset[i] for i in range(len(dataset)))])))


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Packed:
    return pack_all(tmp_path_factory.mktemp("formats"))


def test_formats_were_packed(packed):
    assert {"mmap-pixels", "mmap-encoded"} <= set(packed)


@pytest.mark.parametrize("name", ["mmap-pixels", "mmap-encoded"])
def test_epoch_covers_every_sample_once(packed, name):
    path, options = packed[name]
    dataset = open_dataset(path, **options)
    loader = make_loader(dataset, 4)
    plan = loader.pixfeed_plan
    expected_path = ("batch", 0) if name.endswith("pixels") else ("batch", max(0, plan.cpus - 1))
    assert (plan.path, plan.num_workers) == expected_path
    seen = Counter()
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE, SIZE) and labels.dtype == torch.int64
        seen.update(identities(images))
    assert seen == all_identities(dataset)


def test_pixels_batches_match_single_reads(packed):
    dataset = open_dataset(packed["mmap-pixels"][0])
    images, labels = next(iter(make_loader(dataset, 5, shuffle=False)))
    for i in range(5):
        assert torch.equal(images[i], dataset[i][0]) and int(labels[i]) == dataset[i][1]
