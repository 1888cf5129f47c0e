"""The HDF5 format's own checks: plain-h5py interop and compression
(shared behaviour with lmdb: test_single_writer.py)."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from pixfeed.datasets import H5ImageDataset, MmapImageDataset
from pixfeed.errors import OptionError
from pixfeed.packers import pack
from pixfeed.sources.folder import scan


@pytest.mark.parametrize("compression", [None, "lzf", "gzip"])
def test_plain_h5py_reads_pixels(image_tree, tmp_path, compression):
    pack(image_tree, tmp_path / "h5", "hdf5", store="pixels", size=20, compression=compression, workers=2)
    pack(image_tree, tmp_path / "mmap", "mmap", store="pixels", size=20, workers=2)
    source = scan(image_tree)
    with h5py.File(tmp_path / "h5" / "data.h5", "r") as f:
        images = f["images"]
        assert images.dtype == np.uint8 and images.chunks == (1, 20, 20, 3) and images.compression == compression
        assert np.array_equal(images[:], np.load(tmp_path / "mmap" / "images.npy"))
        assert f["labels"].dtype == np.int64 and list(f["labels"][:]) == list(source.labels)
        assert [k.decode() for k in f["keys"][:]] == source.keys
        assert f["checksums"].dtype == np.uint64
        assert json.loads(f.attrs["classes"]) == source.classes
        assert json.loads(f.attrs["options"])["compression"] == compression and f.attrs["store"] == "pixels"


def test_plain_h5py_reads_encoded(image_tree, tmp_path):
    pack(image_tree, tmp_path / "out", "hdf5", workers=2)
    source = scan(image_tree)
    with h5py.File(tmp_path / "out" / "data.h5", "r") as f:
        assert h5py.check_vlen_dtype(f["encoded"].dtype) == np.uint8 and "images" not in f
        assert f["encoded"][7].tobytes() == (image_tree / source.paths[7]).read_bytes()


def test_compression_needs_pixels(image_tree, tmp_path):
    with pytest.raises(OptionError, match=r"--compression \(compression=\) applies to --store pixels only"):
        pack(image_tree, tmp_path / "out", "hdf5", compression="gzip")
    with pytest.raises(OptionError, match="--compression 'zstd'"):
        pack(image_tree, tmp_path / "out", "hdf5", store="pixels", compression="zstd")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("compression", [None, "lzf"])
def test_sparse_batches_read_row_by_row(image_tree, tmp_path, compression):
    """Sparse batches read one row at a time: uncompressed rows as raw chunks, the others through h5py."""
    pack(image_tree, tmp_path / "h5", "hdf5", store="pixels", size=20, compression=compression, workers=2)
    pack(image_tree, tmp_path / "mmap", "mmap", store="pixels", size=20, workers=2)
    ds, ref = H5ImageDataset(tmp_path / "h5"), MmapImageDataset(tmp_path / "mmap")
    assert ds.handle["raw_chunks"] == (compression is None)
    indices = [11, 0, 11, 5]  # span 12 > 2 x 4: the row-by-row path
    (images, labels), (want, want_labels) = ds.get_batch(indices), ref.get_batch(indices)
    assert torch.equal(images, want) and torch.equal(labels, want_labels)


def test_scattered_encoded_reads_come_back_in_the_order_asked(image_tree, tmp_path):
    """Records far apart (a shuffled batch, a repack's task into shuffled shards) are read in one
    selection of their distinct rows; repeats and any order come back as asked, each checked."""
    pack(image_tree, tmp_path / "h5", "hdf5", workers=2)
    ds, source = H5ImageDataset(tmp_path / "h5"), scan(image_tree)
    n = len(ds)
    asked = [n - 1, 0, n - 1, 2, 1]  # spans the whole dataset: not a slice
    idx, stored, labels = ds.read_checked(asked)
    assert list(idx) == asked and list(labels) == [source.labels[i] for i in asked]
    assert [bytes(s) for s in stored] == [(image_tree / source.paths[i]).read_bytes() for i in asked]
