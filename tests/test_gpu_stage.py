"""The device stage's host side on the CPU (issue #45): stored pixels read straight into the staging's slot
(copied once on the host), the long-lived reader thread, and the plan's rate for the device path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pixfeed.datasets import open_dataset
from pixfeed.image import gpu
from pixfeed.loaders.device import DeviceRecords, device_loader
from pixfeed.packers import pack
from pixfeed.sample import make_sample

SIZE = (40, 48)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def pixels(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage")
    src = make_sample(root / "src", count=20, seed=3)
    pack(src, root / "pix", "mmap", store="pixels", size=64, workers=1)
    return root / "pix"


class SlotStaging(gpu.Staging):
    """``Staging`` with host slots on the CPU (as pinned ones on CUDA); what it sends is copied out of the
    slot (as the device copy would be), and it notes for each send whether the pixels were already there."""

    def __init__(self) -> None:
        super().__init__(CPU, slots=4)
        self.staged, self.placed = True, []

    def _buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def send(self, arrays):
        k = self._reserved
        self.placed.append(k is not None and gpu._placed(arrays[0], self.buffers[k], 0))
        return super().send(arrays)

    def _ship(self, k, end, arrays, offsets):
        host = self.buffers[k].numpy()
        return [torch.from_numpy(host[at:at + a.nbytes].view(a.dtype).reshape(a.shape).copy())
                for a, at in zip(arrays, offsets)]


def device_path(ds, batch_size, **options):
    return device_loader(ds, batch_size, device=CPU, decode_on="device", num_workers=0, **options)


def _view(loader) -> DeviceRecords:
    view = loader.dataset
    while not isinstance(view, DeviceRecords):
        view = view.dataset
    return view


def test_stored_pixels_are_read_into_the_slot_they_are_sent_from(pixels):
    """Every batch's pixels are gathered straight into a reserved slot (no second host copy), and the batches
    are those of the stage without it: same pixels, labels, crops, two epochs."""
    ds = open_dataset(pixels, size=SIZE, crop="random")
    reference = device_path(ds, 6, seed=4)
    assert _view(reference).staging is reference.pixfeed_device.staging  # make_loader wires it
    want = [list(reference) for _ in range(2)]  # off CUDA nothing is reserved: gathered, then sent
    loader = device_path(ds, 6, seed=4)
    loader.pixfeed_device.staging = _view(loader).staging = staging = SlotStaging()
    got = [list(loader) for _ in range(2)]
    assert staging.placed == [True] * sum(len(e) for e in got) and len(staging.placed) == 8
    for w_epoch, g_epoch in zip(want, got):
        for (wi, wl), (gi, gl) in zip(w_epoch, g_epoch):
            assert torch.equal(wl, gl) and torch.equal(wi, gi)


def test_a_slot_reserved_but_not_sent_is_not_reused_wrongly():
    """An array sent that is not the reserved slot's (a batch read elsewhere) is copied into a fresh slot,
    and a reservation left unsent (an epoch left early) does not leak into the next send."""
    staging = SlotStaging()
    first = staging.reserve([((2, 3), np.uint8), ((2,), np.int64)])
    first[0][:] = 7
    first[1][:] = (1, 2)
    other = np.full((2, 3), 9, np.uint8)
    sent = staging.send([other, np.array([5, 6], np.int64)])
    assert staging.placed == [False] and sent[0].eq(9).all() and sent[1].tolist() == [5, 6]
    again = staging.reserve([((2, 3), np.uint8), ((2,), np.int64)])
    again[0][:], again[1][:] = 3, (7, 8)
    sent = staging.send(again)
    assert staging.placed[-1] and sent[0].eq(3).all() and sent[1].tolist() == [7, 8]


def test_a_worker_process_copy_of_the_view_reads_into_its_own_arrays(pixels):
    import pickle
    view = DeviceRecords(open_dataset(pixels, size=SIZE, crop="random"), "stored", SlotStaging())
    assert pickle.loads(pickle.dumps(view)).staging is None
