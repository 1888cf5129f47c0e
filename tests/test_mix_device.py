"""A mixture (pixfeed.mix) on the device path (issue #46 item 3), driven on the CPU: stored pixels cropped by
``gpu.crop_resize_batch`` and encoded records decoded by nvImageCodec's CPU backend, as tests/test_gpu_path.py
drives one dataset.  The batches hold the samples, labels, sources, boxes and flips of the CPU path (the same
mixture without ``device=``), their pixels within 40 dB of its (the device's resize is not Pillow's); a
mixture whose sources do not all qualify in one kind and geometry keeps the CPU path and says why."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

import pixfeed
from conftest import make_tree
from pixfeed.datasets import open_dataset
from pixfeed.errors import OptionError
from pixfeed.image import geometry, region
from pixfeed.loaders import make_loader
from pixfeed.loaders.device import STORED, DeviceRecords, device_loader, feed_kind
from pixfeed.packers import pack
from test_gpu_path import _recorder
from test_gpu_path import device_plans as device_plans_of
from test_gpu_stage import SlotStaging

SIZE = (20, 24)  # (H, W): not square
CPU = torch.device("cpu")
SEED, BATCH = 7, 5


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """Two class lists ((cat, dog, eel) and (fox, dog)) packed as stored pixels (two of the same stored
    shape, one of another) and as encoded records."""
    root = tmp_path_factory.mktemp("mixdev")
    a, b = make_tree(root / "a", per_class=4), make_tree(root / "b", classes=("fox", "dog"), per_class=4)
    pack(a, root / "pix_a", "mmap", store="pixels", size=32, workers=1)
    pack(b, root / "pix_b", "mmap", store="pixels", size=32, workers=1)
    pack(b, root / "pix_b40", "mmap", store="pixels", size=40, workers=1)
    pack(a, root / "enc_a", "mmap", store="encoded", workers=1)
    pack(b, root / "enc_b", "lmdb", store="encoded", workers=1)
    return root


def device_path(dataset, batch_size, **options):
    return device_loader(dataset, batch_size, device=CPU, decode_on="device", backend="cpu", num_workers=0,
                         **options)


def _view(loader) -> DeviceRecords:
    view = loader.dataset
    while not isinstance(view, DeviceRecords):
        view = view.dataset
    return view


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def reads(mixture):
    """Every record each source of ``mixture`` reads (its ``read_checked``), in order, by source."""
    seen = [[] for _ in mixture.sources]
    for s, ds in enumerate(mixture.sources):
        real = ds.read_checked

        def read(indices, *args, _real=real, _s=s, **kwargs):
            seen[_s].extend(int(i) for i in np.asarray(indices).reshape(-1))
            return _real(indices, *args, **kwargs)
        ds.read_checked = read
    return seen


def same_as_cpu_path(mixture, reference, monkeypatch, epochs=2, size=SIZE, **options):
    """Run ``reference`` (the CPU path) and ``mixture`` on the device path for ``epochs`` epochs with one seed;
    assert the same labels, sources, boxes and flips, pixels within 40 dB; return the device loader and the
    records the device path read each epoch."""
    cpu_plans = []  # the CPU path draws each sample's plan through geometry.plan
    monkeypatch.setattr(geometry, "plan", _recorder(geometry.plan, cpu_plans))
    ref_loader = make_loader(reference, BATCH, seed=SEED, num_workers=0, decode_threads=1)
    want = [list(ref_loader) for _ in range(epochs)]
    monkeypatch.undo()
    device_plans = device_plans_of(monkeypatch)  # (thread, plan) of every plan the device renders
    loader = device_path(mixture, BATCH, seed=SEED, **options)
    seen = reads(mixture)
    got = []
    for _ in range(epochs):
        got.append(list(loader))
        got.append([list(s) for s in seen])
        for s in seen:
            s.clear()
    thread = loader.pixfeed_device._thread
    made = [p for t, p in device_plans if t is thread]
    assert [tuple(p) for p in made] == [tuple(p) for p in cpu_plans]  # every box and flip, in order
    assert len(made) == epochs * len(mixture)
    for want_epoch, got_epoch in zip(want, got[0::2]):
        assert len(want_epoch) == len(got_epoch)
        for w, g in zip(want_epoch, got_epoch):
            assert len(w) == len(g)
            assert all(torch.equal(a, b) for a, b in zip(w[1:], g[1:]))  # labels (and sources)
            assert g[0].shape == w[0].shape == (len(w[1]), 3, *size)
            assert min(psnr(a, b) for a, b in zip(g[0], w[0])) >= 40
    return loader, got[1::2]


def test_stored_pixels_of_two_packs_match_the_cpu_path_every_sample_once(packs, monkeypatch):
    """Two stored-pixel packs cropped at random: each sample's crop is drawn from (seed, source, pass, record)
    as the CPU path draws it, labels mapped by class name, every record of both sources read once an epoch,
    and the epochs draw afresh."""
    def mixture():
        return pixfeed.mix([open_dataset(packs / p, size=SIZE, crop="random") for p in ("pix_a", "pix_b")],
                           with_source=True)
    mix = mixture()
    assert feed_kind(mix)[0] == STORED
    loader, read = same_as_cpu_path(mix, mixture(), monkeypatch)
    assert loader.pixfeed_plan.decode_on == "cpu (cpu backend)"
    for epoch in read:
        assert [sorted(r) for r in epoch] == [list(range(12)), list(range(8))]
    assert mix.classes == ["cat", "dog", "eel", "fox"]
    batches = list(loader)
    labels, sources = (torch.cat([b[k] for b in batches]) for k in (1, 2))
    assert Counter(zip(sources.tolist(), labels.tolist())) == {(0, 0): 4, (0, 1): 4, (0, 2): 4, (1, 3): 4,
                                                               (1, 1): 4}  # fox 0 -> 3, dog 1 -> 1
    first, second = (next(iter(loader))[0] for _ in range(2))
    assert not torch.equal(first, second)  # another epoch, other crops


def test_repeated_sources_and_stored_pixels_resized(packs, monkeypatch):
    """Quotas other than every sample once (a source seen twice an epoch: two crops of one record, drawn
    apart as on the CPU path), and a resize (stored 32x32 to 36x40, center): the CPU path's samples."""
    def mixture():
        return pixfeed.mix([open_dataset(packs / p, size=SIZE, crop=crop) for p, crop in
                            (("pix_a", "random"), ("pix_b", "random"))], repeats=[1, 2])
    mix = mixture()
    _, read = same_as_cpu_path(mix, mixture(), monkeypatch, epochs=1)
    assert sorted(read[0][0]) == list(range(12)) and sorted(read[0][1]) == sorted(list(range(8)) * 2)
    monkeypatch.undo()

    def resized():  # center, larger than stored: a resize, not a slice
        return pixfeed.mix([open_dataset(packs / p, size=(36, 40)) for p in ("pix_a", "pix_b")])
    assert feed_kind(resized())[0] == STORED
    same_as_cpu_path(resized(), resized(), monkeypatch, epochs=1, size=(36, 40))


def test_a_mixture_read_into_the_staging_slot_gives_the_same_batches(packs):
    """Every source reads into its rows of the staging's reserved slot (no second host copy): the batches are
    those of the plain path, sources included."""
    def loader():
        return device_path(pixfeed.mix([open_dataset(packs / p, size=SIZE, crop="random")
                                        for p in ("pix_a", "pix_b")], with_source=True), BATCH, seed=SEED)
    want = list(loader())
    slotted = loader()
    slotted.pixfeed_device.staging = _view(slotted).staging = staging = SlotStaging()
    got = list(slotted)
    assert len(staging.placed) == len(got) == 4 and all(staging.placed)
    for w, g in zip(want, got):
        assert len(g) == 3 and all(torch.equal(a, b) for a, b in zip(w, g))


def test_resume_mid_epoch_on_the_device_path(packs):
    def loader():
        return device_path(pixfeed.mix([open_dataset(packs / p, size=SIZE, crop="random")
                                        for p in ("pix_a", "pix_b")]), BATCH, seed=SEED)
    whole = loader()
    whole.set_epoch(1)
    want = list(whole)
    part = loader()
    part.set_epoch(1)
    it = iter(part)
    first = [next(it), next(it)]
    state = part.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    got = first + list(resumed)
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_workers_read_the_batches_of_the_training_process(packs):
    """DataLoader workers read a copy of the view and its mixture (the epoch in shared memory): the batches
    of num_workers=0, a source seen 1.5 times an epoch included."""
    def batches(workers):
        mix = pixfeed.mix([open_dataset(packs / p, size=SIZE, crop="random") for p in ("pix_a", "pix_b")],
                          repeats=[1, 1.5], with_source=True)
        loader = device_loader(mix, BATCH, device=CPU, decode_on="device", num_workers=workers, seed=SEED)
        loader.set_epoch(3)
        assert loader.num_workers == workers
        return list(loader)
    want, got = batches(0), batches(2)
    assert len(want) == len(got) == 5
    for w, g in zip(want, got):
        assert all(torch.equal(a, b) for a, b in zip(w, g))


@pytest.mark.skipif(not region.available(), reason="nvidia-nvimgcodec not installed (pixfeed[region])")
def test_encoded_packs_match_the_cpu_path(packs, monkeypatch):
    """Encoded records of two packs (mmap and LMDB) decoded by nvImageCodec's CPU backend: the CPU path's
    boxes, flips, labels and sources; pixels within 40 dB of its exact (Pillow's) pixels."""
    def mixture(**exact):
        return pixfeed.mix([open_dataset(packs / p, size=SIZE, crop="random", **exact) for p in ("enc_a", "enc_b")],
                           with_source=True)
    mix = mixture()
    assert feed_kind(mix)[0] == "encoded"
    _, read = same_as_cpu_path(mix, mixture(exact=True), monkeypatch)
    for epoch in read:
        assert [sorted(r) for r in epoch] == [list(range(12)), list(range(8))]


def test_sources_that_do_not_qualify_together_keep_the_cpu_path_and_say_why(packs):
    random = open_dataset(packs / "pix_a", size=SIZE, crop="random")
    cases = {  # another source -> words the plan's reason holds
        "sliced": (open_dataset(packs / "pix_b", size=SIZE), "a center crop of stored pixels is a slice"),
        "transform": (open_dataset(packs / "pix_b", size=SIZE, crop="random", transform=lambda t: t),
                      "transform"),
        "kind": (open_dataset(packs / "enc_b", size=SIZE, crop="random"), "differ in kind"),
        "shape": (open_dataset(packs / "pix_b40", size=SIZE, crop="random"), "stored_shape"),
    }
    for case, (other, words) in cases.items():
        mix = pixfeed.mix([random, other])
        kind, why = feed_kind(mix)
        assert kind not in ("encoded", "stored") and words in why, (case, why)
        loader = device_loader(mix, BATCH, device=CPU, num_workers=0, seed=SEED)
        assert loader.pixfeed_plan.decode_on == "cpu", case
        assert words in loader.pixfeed_plan.reasons["decode_on"] and "source 1" in loader.pixfeed_plan.reasons[
            "decode_on"], case
        images, labels = next(iter(loader))
        assert images.shape == (BATCH, 3, *SIZE) and len(labels) == BATCH
        with pytest.raises(OptionError, match="source 1"):
            device_path(mix, BATCH)


# ---- on a CUDA device (skipped without one; benchmarks/gpu_check.sh runs the tests marked gpu) -------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("store", ["pix", "enc"])
def test_cuda_mixture_makes_the_cpu_stand_ins_batches(packs, store):
    """make_loader(mixture, device="cuda") chooses the device path and gives the batches (labels and sources
    exact, pixels within a grey level) of the same path run on the CPU."""
    from pixfeed.image import gpu
    if store == "enc" and not gpu.available("cuda")[0]:
        pytest.skip(gpu.available("cuda")[1])

    def mixture():
        return pixfeed.mix([open_dataset(packs / f"{store}_{p}", size=SIZE, crop="random") for p in ("a", "b")],
                           with_source=True)
    if store == "pix":  # the plan's choice: stored pixels are cropped on the GPU
        loader = make_loader(mixture(), BATCH, seed=SEED, device="cuda")
    else:  # the GPU's decoder asked for (the plan may find the CPUs faster)
        loader = device_loader(mixture(), BATCH, seed=SEED, device="cuda", decode_on="device")
    assert loader.pixfeed_plan.decode_on.startswith("cuda")
    got = [[t.cpu() for t in batch] for batch in loader]
    want = list(device_path(mixture(), BATCH, seed=SEED))
    assert len(got) == len(want)
    for (a, la, sa), (b, lb, sb) in zip(got, want):
        assert torch.equal(la, lb) and torch.equal(sa, sb)
        if store == "pix":  # the same kernels: cuBLAS may round a pixel the other way
            assert (a.int() - b.int()).abs().max() <= 1
        else:  # the GPU's JPEG decoder is not the CPU backend's
            assert min(psnr(x, y) for x, y in zip(a, b)) >= 35
