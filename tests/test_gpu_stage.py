"""The device stage's host side on the CPU (issue #45): stored pixels read straight into the staging's slot
(copied once on the host), the long-lived reader thread, and the plan's rate for the device path."""
from __future__ import annotations

import threading
import time

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
    assert sum(len(e) for e in got) == 8 and len(staging.placed) in (8, 9)  # 9: the third epoch's first, made ahead
    assert all(staging.placed)
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


def _made_in(stage, monkeypatch) -> list:
    threads, make = [], stage.make

    def recording(batch):
        threads.append(threading.current_thread())
        return make(batch)
    monkeypatch.setattr(stage, "make", recording)
    return threads


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(lx, ly) for (x, lx), (y, ly) in zip(a, b))


def test_one_reader_thread_for_every_epoch_and_an_epoch_left_early_ends(pixels, monkeypatch):
    """Three epochs, the first left after one batch (its iterator kept): every batch is made in the same
    thread, the stage's, not the loop's; the epoch left early ends when the next starts and hands out
    nothing more; the next epochs are exactly the reference loader's (nothing made ahead leaks into them)."""
    ds = open_dataset(pixels, size=SIZE, crop="random")
    reference = device_path(ds, 6, seed=4)
    want = [list(reference) for _ in range(3)]
    loader = device_path(ds, 6, seed=4)
    threads = _made_in(loader.pixfeed_device, monkeypatch)
    left = iter(loader)
    assert _same([next(left)], want[0][:1])
    got = [list(loader), list(loader)]
    with pytest.raises(StopIteration):
        next(left)
    assert _same(got[0], want[1]) and _same(got[1], want[2])
    thread = loader.pixfeed_device._thread
    assert set(threads) == {thread} and thread is not threading.current_thread() and thread.is_alive()


def test_resume_on_the_same_loader_after_an_epoch_left_early_is_exact(pixels):
    ds = open_dataset(pixels, size=SIZE, crop="random")
    reference = device_path(ds, 4, seed=6)
    reference.set_epoch(2)
    whole = list(reference)
    loader = device_path(ds, 4, seed=6)
    loader.set_epoch(2)
    it = iter(loader)
    first = [next(it), next(it)]
    state = loader.state_dict()
    loader.load_state_dict(state)
    rest = list(loader)
    assert _same(first + rest, whole)


def test_the_reader_thread_ends_with_its_loader(pixels):
    import gc
    loader = device_path(open_dataset(pixels, size=SIZE, crop="random"), 4, seed=6)
    it = iter(loader)
    next(it)  # left mid-epoch: the thread is filling it
    thread = loader.pixfeed_device._thread
    del it, loader
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_the_plan_rates_the_device_path_by_the_slower_of_decoder_and_host():
    from pixfeed.loaders import plan as rules
    cuda = torch.device("cuda", 0)
    rate, words = rules.device_rate("encoded")  # the estimate: the decoder is the slower
    assert rate == min(rules.GPU_DECODE_RATE, int(1e6 / rules.HOST_US["encoded"]))
    assert "decoder" in words and "host thread" in words and "estimated" in words
    rate, words = rules.device_rate("encoded", host_us=500.0)  # a slow host: 2,000 images/s
    assert rate == 2000 and "measured" in words and f"{rules.GPU_DECODE_RATE:,}" in words
    assert rules.device_rate("stored", host_us=100.0)[0] == 10_000
    where, why = rules.choose_decode_on(cuda, "encoded", 16, (True, "hw"))
    assert where == "device" and "host thread" in why and "decoder" in why
    where, why = rules.choose_decode_on(cuda, "encoded", 16, (True, "hw"), host_us=2000.0)  # 500/s on the host
    assert where == "cpu" and "about 500/s" in why  # 16 CPUs decode more than that host thread feeds
    assert "host thread" in rules.choose_decode_on(cuda, "stored", 2, (False, ""))[1]


def test_the_stage_measures_its_host_time_and_the_plan_says_it(pixels):
    ds = open_dataset(pixels, size=SIZE, crop="random")
    loader = device_path(ds, 6, seed=4)
    stage = loader.pixfeed_device
    assert stage.host_us is None and "measured" not in loader.pixfeed_plan.reasons["decode_on"]
    list(loader)
    assert stage.images_made == len(ds) and stage.host_us > 0
    assert "as measured" in loader.pixfeed_plan.reasons["decode_on"]


def _reads(view, monkeypatch) -> list:
    seen, read = [], view.dataset.read_checked

    def recording(indices, *args, **kwargs):
        seen.append([int(i) for i in indices])
        return read(indices, *args, **kwargs)
    monkeypatch.setattr(view.dataset, "read_checked", recording)
    return seen


def _made_ahead(view) -> None:
    """Wait (a minute at most: not a timing bound) for the reader to make the next epoch's first batch."""
    waited = time.monotonic()
    while view.early is None and time.monotonic() - waited < 60:
        time.sleep(0.01)
    assert view.early is not None


@pytest.mark.parametrize("crop,size", [("random", SIZE), ("center", (72, 80))])  # center: resized, not a slice
def test_the_next_epochs_first_batch_is_made_before_the_epoch_ends(pixels, monkeypatch, crop, size):
    """When an epoch's records are all read, the reader reads and makes the next epoch's first batch while
    the loop still takes the last ones: the next epoch does not read it again, and every epoch is exactly
    the reference loader's."""
    ds = open_dataset(pixels, size=size, crop=crop)  # seeded by index, or no draws at all
    reference = device_path(ds, 6, seed=4, shuffle=True)
    want = [list(reference) for _ in range(3)]
    loader = device_path(open_dataset(pixels, size=size, crop=crop), 6, seed=4, shuffle=True)  # reads its own
    view = _view(loader)
    reads = _reads(view, monkeypatch)
    it = iter(loader)
    got = [next(it) for _ in range(len(want[0]) - 1)]  # the last batch not taken yet
    waited = time.monotonic()
    while len(reads) <= len(want[0]) and time.monotonic() - waited < 60:  # the reader is not waiting for it
        time.sleep(0.01)
    assert len(reads) == len(want[0]) + 1  # the epoch's batches, then the next epoch's first
    assert view.early is not None and list(view.early[0]) == reads[-1]
    got.append(next(it))
    assert _same(got, want[0])
    assert _same(list(loader), want[1])
    _made_ahead(view)  # the third epoch's first
    assert len(reads) == 2 * len(want[0]) + 1  # the second epoch's first batch was not read again
    assert _same(list(loader), want[2])


def test_a_batch_made_ahead_is_not_used_for_another_epoch_or_a_resume(pixels):
    """set_epoch and load_state_dict between epochs: the batch made ahead is not theirs, and is dropped."""
    ds = open_dataset(pixels, size=SIZE, crop="random")
    reference = device_path(ds, 6, seed=4, shuffle=True)
    reference.set_epoch(5)
    five = list(reference)
    loader = device_path(ds, 6, seed=4, shuffle=True)
    list(loader)
    _made_ahead(_view(loader))  # epoch 1's first batch
    loader.set_epoch(5)
    assert _same(list(loader), five)
    loader.set_epoch(5)
    it = iter(loader)
    first = [next(it), next(it)]
    state = loader.state_dict()
    del it
    loader.load_state_dict(state)
    assert _same(first + list(loader), five)


def test_only_the_stages_thread_reads_into_the_slots(pixels):
    """The watchdog's reader thread (cold storage) reads into its own arrays: an epoch left early may leave
    its read running while the next epoch's take the ring's slots."""
    view = DeviceRecords(open_dataset(pixels, size=SIZE, crop="random"), "stored", SlotStaging())
    view.reader = threading.Thread(target=lambda: None)  # another thread's
    batch = view.get_batch([0, 1])
    assert view.staging._reserved is None and batch.params is None
    view.reader = threading.current_thread()
    batch = view.get_batch([0, 1])
    assert batch.params is not None and gpu._placed(batch.pixels, view.staging.buffers[view.staging._reserved], 0)


def test_nothing_is_made_ahead_where_a_read_may_wait_on_storage(pixels):
    """The watchdog's reader thread bounds every read's wait (cold storage); a read made ahead in the stage's
    own thread would not be bounded, so none is."""
    loader = device_path(open_dataset(pixels, size=SIZE, crop="random"), 6, seed=4)
    stage = loader.pixfeed_device
    assert stage.following() is not None
    loader.pixfeed_plan.reader_thread = True
    assert stage.following() is None


def test_a_script_leaving_an_epoch_part_way_exits_cleanly(pixels, tmp_path):
    """The stage's reader thread makes batches ahead inside torch kernels; a script that takes one batch and
    returns used to abort at exit ("terminate called without an active exception", status 134) as the
    interpreter tore torch down under that thread.  At exit the thread is now stopped and waited for."""
    import subprocess
    import sys

    script = tmp_path / "part_way.py"
    script.write_text(
        "import torch, pixfeed\n"
        "from pixfeed.loaders.device import device_loader\n"
        f"ds = pixfeed.open_dataset({str(pixels)!r}, size=(40, 48), crop='random')\n"
        "loader = device_loader(ds, 4, device=torch.device('cpu'), decode_on='device', num_workers=0)\n"
        "batch = next(iter(loader))\n"
        "print('took', tuple(batch[0].shape))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "took (4, 3, 40, 48)" in done.stdout
    assert "terminate called" not in done.stderr
