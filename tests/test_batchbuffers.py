"""Recycled batch arrays: reused once nothing refers to them, never while any batch built on them
lives, whoever holds it (a view, a tensor, a loader's batch kept by the user)."""
from __future__ import annotations

import numpy as np
import torch

import pixfeed
from conftest import make_tree
from pixfeed.image import buffers as batchbuffers
from pixfeed.loaders import make_loader


def test_an_array_comes_back_only_when_nothing_refers_to_it():
    shape = (3, 5, 7, 3)
    a = batchbuffers.empty(shape)
    first = a.ctypes.data
    tensor = torch.from_numpy(a[:, 1:]).permute(0, 3, 1, 2)  # a view of a view, as a batch is
    del a
    b = batchbuffers.empty(shape)
    assert b.ctypes.data != first  # the tensor still holds the first array
    second = b.ctypes.data
    del b
    assert batchbuffers.empty(shape).ctypes.data == second  # nothing holds the second: it comes back
    del tensor
    held = [batchbuffers.empty(shape) for _ in range(batchbuffers.KEEP + 2)]
    assert len({x.ctypes.data for x in held}) == len(held)


def test_batches_a_user_keeps_stay_intact(tmp_path):
    """Keeping every batch of two epochs (stored pixels, no workers): each still holds its own images."""
    src = make_tree(tmp_path / "src", per_class=8)
    pixfeed.pack(src, tmp_path / "ds", "mmap", store="pixels", size=16, workers=1)
    ds = pixfeed.open_dataset(tmp_path / "ds")
    loader = make_loader(ds, batch_size=5, shuffle=False, num_workers=0)
    kept = [x for _ in range(2) for x, _ in loader]
    want = torch.stack([ds[i][0] for i in range(len(ds))])
    assert torch.equal(torch.cat(kept), torch.cat([want, want]))
    assert len({x.data_ptr() for x in kept}) == len(kept)


def test_what_is_kept_is_bounded(monkeypatch):
    """Beyond KEEP_BYTES in all, arrays are made and dropped as before: nothing more is kept."""
    monkeypatch.setattr(batchbuffers, "_kept", {})
    monkeypatch.setattr(batchbuffers, "KEEP_BYTES", 3000)
    held = [batchbuffers.empty((1000,)) for _ in range(5)]
    assert sum(a.nbytes for v in batchbuffers._kept.values() for a in v) == 3000
    del held
    assert len({batchbuffers.empty((1000,)).ctypes.data for _ in range(3)}) == 1  # a kept one comes back


def test_batches_of_varying_length_reuse_the_kept_arrays(monkeypatch):
    """Kept by row shape: a shorter batch takes the first rows of a free longer one (a mixture reads one
    group per source, of varying length, each batch); with KEEP kept, a longer one replaces the smallest."""
    monkeypatch.setattr(batchbuffers, "_kept", {})
    first = batchbuffers.empty((10, 4, 3))
    address = first.ctypes.data
    del first
    shorter = batchbuffers.empty((7, 4, 3))
    assert shorter.shape == (7, 4, 3) and shorter.ctypes.data == address
    held = [shorter] + [batchbuffers.empty((5, 4, 3)) for _ in range(batchbuffers.KEEP - 1)]
    del held[1:]  # every kept array but the first (rows 10) is free: 3 of 5 rows
    longer = batchbuffers.empty((12, 4, 3))
    kept = next(iter(batchbuffers._kept.values()))
    assert len(kept) == batchbuffers.KEEP and any(np.shares_memory(a, longer) for a in kept)
    assert sorted(len(a) for a in kept) == [5, 5, 10, 12]
    del longer
    again = batchbuffers.empty((11, 4, 3))
    assert again.shape == (11, 4, 3) and any(np.shares_memory(a, again) and len(a) == 12 for a in kept)
