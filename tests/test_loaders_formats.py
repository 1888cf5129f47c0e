"""make_loader over every packed format: the path it takes, and exact coverage of an epoch."""
from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch
from torch.utils.data import IterableDataset

from conftest import make_tree, sized
from pixfeed.errors import OptionError
from pixfeed.loaders import make_loader
from pixfeed.packers import pack
from pixfeed.registry import FORMATS
from pixfeed.datasets import open_dataset

SIZE = 16
STORES = ("pixels", "encoded")
Packed = Dict[str, Tuple[str, dict]]


def pack_all(root: Path) -> Packed:
    """Every format in both stores: name -> (path, open_dataset options).  A pack that fails fails the test."""
    src = make_tree(root / "src", per_class=11)  # 33 images: an odd count, so ranks need padding, and
    # enough per worker that two epochs of one order by chance (1 in 8! squared) never fail a test
    packed: Packed = {}
    for fmt in FORMATS:
        for store in STORES:
            dst = root / f"{fmt}-{store}"
            pack(src, dst, fmt, store=store, **sized(store, SIZE), workers=1)
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


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("store", STORES)
def test_epoch_covers_every_sample_once(packed, monkeypatch, fmt, store):
    """Stored pixels are read in process, encoded images decoded in workers; each sample once either way."""
    monkeypatch.setattr("pixfeed.loaders.loader.available_cpus", lambda: 3)  # 2 workers by the documented rule
    name = f"{fmt}-{store}"
    path, options = packed[name]
    dataset = open_dataset(path, **options)
    loader = make_loader(dataset, 4)
    plan = loader.pixfeed_plan
    assert plan.path == ("iterable" if fmt == "wds" else "batch"), name
    # stored pixels: a gathered batch in process; a WebDataset's samples cost more to read than to hand over
    assert plan.num_workers == (0 if store == "pixels" and fmt != "wds" else 2), name
    seen = Counter()
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE, SIZE) and labels.dtype == torch.int64, name
        seen.update(identities(images))
    reference = open_dataset(packed[f"mmap-{store}"][0], **options)  # read one by one, by index
    assert seen == all_identities(reference) and sum(seen.values()) == 33, name


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
    cropped = make_loader(open_dataset(path, transform=lambda x: x[:, :4, :4]), 4, num_workers=0)
    shapes = [tuple(images.shape) for images, _ in cropped]  # a transform may give every image one shape
    assert shapes == [(4, 3, 4, 4)] * 8 + [(1, 3, 4, 4)]


def test_webdataset_takes_shuffle_and_seed_from_make_loader(packed):
    path, options = packed["wds-pixels"]
    in_order = make_loader(open_dataset(path), 4, num_workers=0, shuffle=False)  # opened with shuffle=True
    reference = torch.stack([image for image, _ in open_dataset(path, shuffle=False)])  # record order
    assert [s for images, _ in in_order for s in identities(images)] == identities(reference)

    def epochs(seed):
        loader = make_loader(open_dataset(path, shuffle=False), 4, num_workers=0, seed=seed, shuffle=True)
        return [[s for images, _ in loader for s in identities(images)] for _ in range(2)]

    first = epochs(1)
    assert first == epochs(1) and first[0] != first[1] and first[0] != epochs(2)[0]


@pytest.fixture(scope="module")
def wds_of_37(tmp_path_factory) -> str:
    """37 stored-pixel samples in 8 shards of up to 5 (more shards than workers)."""
    root = tmp_path_factory.mktemp("wds37")
    src = make_tree(root / "src", classes=("a", "b", "c", "d"), per_class=10)
    for extra in sorted((src / "d").iterdir())[:3]:
        extra.unlink()
    pack(src, root / "wds", "wds", store="pixels", size=SIZE, workers=1, shard_size=5)
    return str(root / "wds")


@pytest.mark.filterwarnings("ignore:.*every worker reads them all")  # wds-pixels: one shard, 2 workers
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_loader_yields_its_length_in_batches_in_every_format_and_world(packed, wds_of_37, monkeypatch, workers,
                                                                        drop_last):
    """len(loader) batches, each of batch_size but the last (none short with drop_last), on one rank and on
    each of two; a WebDataset's workers each yielded their own partial batch (37 samples, 2 workers:
    [8, 8, 8, 8, 3, 2] while len said 5); an epoch on one rank still reads each sample once."""
    from pixfeed.machine.world import World

    datasets = {name: packed[name] for name in packed if name.endswith("pixels")}
    datasets["wds-37"] = (wds_of_37, {})
    for name, (path, options) in datasets.items():
        for rank, world in ((0, 1), (0, 2), (1, 2)):
            monkeypatch.setattr(World, "detect", classmethod(lambda cls, *a, rank=rank, world=world, **k:
                                                             World(rank, world)))
            loader = make_loader(open_dataset(path, **options), 8, num_workers=workers, drop_last=drop_last,
                                 persistent_workers=False)  # no workers left over from the loader before
            sizes = [len(labels) for _, labels in loader]
            where = (name, rank, world, sizes)
            assert len(sizes) == len(loader), where
            assert set(sizes[:-1]) <= {8} and (sizes[-1] == 8 if drop_last else 0 < sizes[-1] <= 8), where
            if world == 1 and not drop_last:
                total = len(open_dataset(path, **options))
                assert sum(sizes) == total, where
    monkeypatch.undo()
    loader = make_loader(open_dataset(wds_of_37), 8, num_workers=2, persistent_workers=False)
    assert [len(labels) for _, labels in loader] == [8, 8, 8, 8, 5] and len(loader) == 5
