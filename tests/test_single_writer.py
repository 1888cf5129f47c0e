"""What the single-writer formats (lmdb, hdf5) share, tested against the mmap
format packed from the same source: pixel-exact round trips, batches,
pickling, DataLoader workers, damage detection, flat sources, --on-error skip.
Format-specific checks (plain lmdb / h5py interop, map growth, compression)
live in test_lmdb.py and test_hdf5.py."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from pixfeed.datasets import MmapImageDataset, open_dataset
from pixfeed.errors import CorruptDataError
from pixfeed.packers import pack
from pixfeed.sources.folder import scan
from conftest import sized


def pack_both(src: Path, tmp: Path, fmt: str, **options):
    """Pack ``src`` as ``fmt`` and as mmap with the same options; return both datasets."""
    pack(src, tmp / fmt, fmt, workers=2, **options)
    pack(src, tmp / "mmap", "mmap", workers=2, **options)
    return open_dataset(tmp / fmt), MmapImageDataset(tmp / "mmap")


def assert_same_as_mmap(ds, ref) -> None:
    """Same count, classes, keys, labels and pixels (pixel-exact) as the mmap format."""
    assert type(ds).__name__ != "MmapImageDataset"
    assert len(ds) == len(ref) and ds.classes == ref.classes and ds.store == ref.store
    for i in range(len(ref)):
        (img, label), (want, want_label) = ds[i], ref[i]
        assert ds.key(i) == ref.key(i) and label == want_label
        assert torch.equal(img, want), f"record {i} ({ds.key(i)}) differs from mmap"


def assert_encoded_is_source(ds, src: Path) -> None:
    """In encoded mode the stored bytes are the source files, unchanged."""
    stored = ds.read_stored(np.arange(len(ds)))[0]
    for data, path in zip(stored, scan(src).paths, strict=True):
        assert bytes(data) == (src / path).read_bytes()


def assert_getitems_matches(ds) -> None:
    indices = [5, 0, 5, len(ds) - 1, 2, -1]
    batch = ds.__getitems__(indices)
    for (img, label), i in zip(batch, indices, strict=True):
        want, want_label = ds[i]
        assert torch.equal(img, want) and label == want_label


def assert_pickles(ds) -> None:
    """Pickle round trips before and after the handle is opened give equal datasets."""
    before = pickle.loads(pickle.dumps(ds))
    first = ds[1]
    assert ds._handle is not None
    after = pickle.loads(pickle.dumps(ds))
    assert after._handle is None
    for copy in (before, after):
        img, label = copy[1]
        assert torch.equal(img, first[0]) and label == first[1]


def assert_dataloader_sees_all(ds) -> None:
    """A 2-worker DataLoader yields every record once, in sampler order."""
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    seen = list(loader)
    assert len(seen) == len(ds)
    for i, (img, label) in enumerate(seen):
        want, want_label = ds[i]
        assert torch.equal(img, want) and label == want_label


def flip_byte(path: Path, needle: bytes) -> None:
    """Flip one byte in the middle of the only occurrence of ``needle`` in ``path``."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, f"{needle[:8]!r}... not found once in {path}"
    data[at + len(needle) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def assert_damage_detected(root: Path, data_file: str, needle: bytes, index: int) -> None:
    """Damaging record ``index``'s stored bytes on disk raises CorruptDataError naming it."""
    flip_byte(root / data_file, needle)
    ds = open_dataset(root)
    with pytest.raises(CorruptDataError, match=rf"record {index} \(key '{ds.key(index)}'\)"):
        ds[index]
    with pytest.raises(CorruptDataError, match=rf"record {index} "):
        ds.__getitems__([0, index])
    ds[index - 1]  # the other records still read


DATA_FILES = {"lmdb": "data.mdb", "hdf5": "data.h5"}
STORES = pytest.mark.parametrize("store", ["pixels", "encoded"])


@pytest.fixture(params=sorted(DATA_FILES))
def fmt(request) -> str:
    return request.param


@STORES
def test_round_trip_equals_mmap(image_tree, tmp_path, fmt, store):
    ds, ref = pack_both(image_tree, tmp_path, fmt, store=store, **sized(store, 24))
    assert ds.format == fmt
    assert_same_as_mmap(ds, ref)
    assert_getitems_matches(ds)
    if store == "encoded":
        assert_encoded_is_source(ds, image_tree)
    else:
        assert torch.equal(ds.get_batch([3, 0, 3])[0], ref.get_batch([3, 0, 3])[0])


def test_default_store_is_encoded_and_only_data_files_remain(image_tree, tmp_path, fmt):
    m = pack(image_tree, tmp_path / "out", fmt, workers=2)
    kept = sorted([DATA_FILES[fmt], "extents.npy", "keys.json", "keys.offsets.npy", "keys.utf8"])
    assert m["store"] == "encoded" and sorted(m["files"]) == kept
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(kept + ["pixfeed.json"])


def test_pickle_and_dataloader_workers(image_tree, tmp_path, fmt):
    pack(image_tree, tmp_path / "out", fmt, store="pixels", size=16, workers=2)
    ds = open_dataset(tmp_path / "out")
    assert_pickles(ds)
    assert_dataloader_sees_all(ds)


@STORES
def test_damaged_record_names_index_and_key(image_tree, tmp_path, fmt, store):
    ds, ref = pack_both(image_tree, tmp_path, fmt, store=store, **sized(store, 24))
    needle = bytes(np.asarray(ref.read_stored(np.array([4]))[0][0]))
    assert_damage_detected(tmp_path / fmt, DATA_FILES[fmt], needle, 4)


def test_flat_source(flat_tree, tmp_path, fmt):
    ds, ref = pack_both(flat_tree, tmp_path, fmt, store="encoded")
    assert ds.classes is None and ds[0][1] == -1
    assert_same_as_mmap(ds, ref)


@STORES
def test_on_error_skip_drops_the_bad_file(image_tree, tmp_path, fmt, store):
    (image_tree / "dog" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")
    ds, ref = pack_both(image_tree, tmp_path, fmt, store=store, **sized(store, 16), on_error="skip")
    assert [s["path"] for s in ds.manifest["skipped"]] == ["dog/broken.jpg"]
    assert len(ds) == len(scan(image_tree)) - 1
    assert_same_as_mmap(ds, ref)
