"""Datasets in an S3-compatible bucket (a real SeaweedFS server, tests/s3server.py):
pack to, pack from, stream and cache, with the same records and integrity checks as local."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import make_tree
from pixfeed import cache
from pixfeed.datasets import WdsImageDataset, open_dataset
from pixfeed.errors import CorruptDataError, DatasetNotFoundError, OptionError, StorageError
from pixfeed.manifest import read_manifest
from pixfeed.packers import pack
from pixfeed.storage import Store

FORMATS = [("mmap", {"size": 16}), ("lmdb", {}), ("hdf5", {"store": "pixels", "size": 12}),
           ("wds", {"shard_size": 4})]


def records(ds) -> list:
    if isinstance(ds, WdsImageDataset):
        return sorted(((k, img.numpy().tobytes(), label) for k, (img, label) in
                       zip(range(len(ds)), ds)), key=lambda r: r[1])
    return [(i, *(lambda s: (s[0].numpy().tobytes(), s[1]))(ds[i])) for i in range(len(ds))]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("s3src") / "src")


@pytest.mark.parametrize("fmt, opts", FORMATS)
def test_pack_to_bucket_reads_back_the_local_records(tree, tmp_path, bucket, s3_server, fmt, opts):
    so = s3_server.options
    local = pack(tree, tmp_path / "local", fmt, workers=2, **opts)
    remote = pack(tree, f"{bucket}/ds", fmt, workers=2, storage_options=so, **opts)
    assert remote["files"] == local["files"]
    assert read_manifest(f"{bucket}/ds", so)["files"] == local["files"]
    a = open_dataset(tmp_path / "local", shuffle=False) if fmt == "wds" else open_dataset(tmp_path / "local")
    kw = {"shuffle": False} if fmt == "wds" else {}
    b = open_dataset(f"{bucket}/ds", storage_options=so, cache_dir=tmp_path / "cache", **kw)
    assert records(b) == records(a)
    assert sorted(Store(f"{bucket}/ds", so).list()) == sorted([*local["files"], "pixfeed.json"])
