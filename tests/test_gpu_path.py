"""The GPU path (issue #37) on the CPU: nvImageCodec's CPU backend stands in for its GPU one and CPU
tensors for CUDA ones, so batching, fallbacks, region decodes, geometry, seeding, resume and the output
options run in CI.  Boxes and flips must equal the CPU path's exactly, pixels within 35 dB PSNR of
``decode(..., exact=False)``.  Tests marked ``gpu`` need CUDA and are skipped without it."""
from __future__ import annotations

import io
import math
import os
import time

import numpy as np
import pytest
import torch
from PIL import Image

from pixfeed.datasets import open_dataset
from pixfeed.errors import OptionError
from pixfeed.image import geometry, gpu, region
from pixfeed.image.decode import decode, oriented_size
from pixfeed.image.pillow import apply_plan
from pixfeed.loaders import device as devicemod
from pixfeed.loaders import make_loader
from pixfeed.loaders import plan as rules
from pixfeed.loaders.device import DeviceRecords, DeviceStage, device_loader
from pixfeed.packers import pack
from pixfeed.sample import make_sample

pytestmark = pytest.mark.skipif(not region.available(), reason="nvidia-nvimgcodec not installed (pixfeed[region])")
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
SIZE = (56, 64)  # (H, W): not square, so a swapped axis would show
CPU = torch.device("cpu")


def psnr(a, b) -> float:
    a, b = (np.asarray(x, dtype=np.float64) for x in (a, b))
    mse = np.mean((a - b) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def hwc(t: torch.Tensor) -> np.ndarray:
    return t.permute(1, 2, 0).cpu().numpy()


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """24 photo-like images (pixfeed sample): JPEGs, grayscale JPEGs, PNGs (RGB and RGBA), several sizes."""
    return make_sample(tmp_path_factory.mktemp("sample") / "src", count=24, seed=1)


@pytest.fixture(scope="module")
def records(sample):
    files = sorted(p for p in sample.rglob("*") if p.is_file())
    return [p.read_bytes() for p in files]


@pytest.fixture(scope="module")
def packs(sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("packs")
    pack(sample, root / "enc", "mmap", store="encoded", workers=1)
    pack(sample, root / "pix", "mmap", store="pixels", size=80, workers=1)
    return root


def jpeg(arr: np.ndarray, orientation: int = 1, mode: str = "RGB") -> bytes:
    img = Image.fromarray(arr).convert(mode)
    out = io.BytesIO()
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    img.save(out, "JPEG", quality=92, exif=exif.tobytes())
    return out.getvalue()


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth gradient with shapes and a little noise (photo-like: no detail at the pixel scale)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    arr = rng.uniform(40, 200, 3) + x[..., None] * rng.uniform(-0.5, 0.5, 3) + y[..., None] * rng.uniform(-0.5, 0.5, 3)
    arr[h // 4: h // 2, w // 3: w // 2] += 50
    arr += rng.normal(0, 3, arr.shape)
    return np.clip(arr, 0, 255).astype(np.uint8)


def plans_for(records, crop: str, seed: int = 0):
    out = []
    for i, r in enumerate(records):
        w, h = oriented_size(r, "test")
        out.append(geometry.plan(w, h, SIZE, "crop", crop, np.random.default_rng([seed, i]), 224 / 256))
    return out


def cpu_decoder():
    return gpu.BatchDecoder(CPU, backend="cpu")


@pytest.mark.parametrize("crop", ["random", "center"])
def test_batch_decoder_matches_the_cpu_path(records, crop):
    """One batched decode of JPEGs and PNGs: the plan's box and flip, pixels >= 35 dB from the CPU path;
    PNGs fall back to the CPU decoder inside the batch, counted; random crops decode only their box."""
    plans = plans_for(records, crop)
    gpu.reset_stats()
    out = cpu_decoder().decode(records, plans, SIZE)
    assert out.shape == (len(records), 3, *SIZE) and out.dtype == torch.uint8
    assert out.is_contiguous(memory_format=torch.channels_last)
    scores = [psnr(hwc(out[j]), decode(r, size=SIZE, plan=p, exact=False)) for j, (r, p) in enumerate(zip(records, plans))]
    assert min(scores) >= 35, scores
    pngs = sum(r[:4] == b"\x89PNG" for r in records)
    assert 0 < pngs < len(records)
    stats = gpu.stats()
    assert (stats["gpu_decoded"], stats["cpu_fallback"]) == (len(records) - pngs, pngs)
    assert stats["gpu_seconds"] > 0
    assert stats["gpu_region"] == (len(records) - pngs if crop == "random" else 0)


def test_flip_and_box_are_the_plans(records):
    """The same box with and without a flip: mirror images; a box rendered at its own size is the
    CPU path's pixels of that box."""
    data = jpeg(photo(90, 120, 3))
    box = geometry.Plan((10, 20, 10 + SIZE[1], 20 + SIZE[0]), (SIZE[1], SIZE[0]), (SIZE[1], SIZE[0]), (0, 0))
    flat, flipped = cpu_decoder().decode([data, data], [box, box._replace(flip=True)], SIZE)
    assert torch.equal(flat.flip(2), flipped)
    np.testing.assert_array_equal(hwc(flat), decode(data, size=SIZE, plan=box, exact=False))


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_rotated_jpegs_decode_whole_and_turn_on_the_device(orientation):
    data = jpeg(photo(70, 100, orientation), orientation)
    plans = plans_for([data] * 4, "random", seed=orientation)
    gpu.reset_stats()
    out = cpu_decoder().decode([data] * 4, plans, SIZE)
    assert gpu.stats()["gpu_region"] == 0 and gpu.stats()["gpu_decoded"] == 4
    for j, p in enumerate(plans):
        assert psnr(hwc(out[j]), decode(data, size=SIZE, plan=p, exact=False)) >= 35


def test_cmyk_and_refused_images_fall_back_inside_the_batch(monkeypatch):
    """CMYK goes to the CPU decoder; an image the decoder returns None for, and a batch call that raises,
    are decoded on the CPU (or one by one) without losing the rest of the batch."""
    arrs = [photo(60, 80, s) for s in range(4)]
    data = [jpeg(arrs[0]), jpeg(arrs[1], mode="CMYK"), jpeg(arrs[2]), jpeg(arrs[3])]
    plans = plans_for(data, "center")
    dec = cpu_decoder()
    n, real, params = dec._codec()

    class Raising:  # the batch call fails: each image is decoded alone
        def decode(self, src, **kw):
            if isinstance(src, list):
                raise RuntimeError("batch failed")
            return real.decode(src, **kw)

    class Refusing:  # None for the second stream it is given (the third record)
        def decode(self, src, **kw):
            return [None if j == 1 else img for j, img in enumerate(real.decode(src, **kw))]

    dec._codec_of = (os.getpid(), (n, Raising(), params))
    gpu.reset_stats()
    out = dec.decode(data, plans, SIZE)
    assert (gpu.stats()["gpu_decoded"], gpu.stats()["cpu_fallback"]) == (3, 1)  # CMYK never reached nvImageCodec
    for j in range(4):
        assert psnr(hwc(out[j]), decode(data[j], size=SIZE, plan=plans[j], exact=False)) >= 35
    dec._codec_of = (os.getpid(), (n, Refusing(), params))
    gpu.reset_stats()
    refused = dec.decode(data, plans, SIZE)
    assert (gpu.stats()["gpu_decoded"], gpu.stats()["cpu_fallback"]) == (2, 2)
    np.testing.assert_array_equal(hwc(refused[2]), decode(data[2], size=SIZE, plan=plans[2], exact=False))
    assert torch.equal(refused[0], out[0]) and torch.equal(refused[3], out[3])
    nones = type("Nones", (), {"decode": lambda self, src, **kw: [None] * len(src)})()
    dec._codec_of = (os.getpid(), (n, nones, params))
    gpu.reset_stats()
    again = dec.decode(data, plans, SIZE)
    assert gpu.stats()["cpu_fallback"] == 4
    assert torch.equal(again[1], out[1]) and torch.equal(again[2], refused[2])  # decoded on the CPU both times
    assert min(psnr(hwc(a), hwc(b)) for a, b in zip(again, out)) >= 35


def test_refused_region_decodes_are_retried_whole_on_the_device(records, monkeypatch):
    jpegs = [r for r in records if r[:2] == b"\xff\xd8"][:4]
    plans = plans_for(jpegs, "random")
    dec = cpu_decoder()
    n, real, params = dec._codec()

    class NoRegions:
        def decode(self, src, **kw):
            first = not hasattr(self, "seen")
            self.seen = True
            return [None] * len(src) if first else real.decode(src, **kw)

    dec._codec_of = (os.getpid(), (n, NoRegions(), params))
    gpu.reset_stats()
    out = dec.decode(jpegs, plans, SIZE)
    assert gpu.stats()["gpu_region"] == 0 and gpu.stats()["gpu_decoded"] == 4
    for j, p in enumerate(plans):
        assert psnr(hwc(out[j]), decode(jpegs[j], size=SIZE, plan=p, exact=False)) >= 35


def test_whole_images_without_size_and_center_crops_by_default():
    data = [jpeg(photo(40, 50, s)) for s in range(3)]
    whole = cpu_decoder().decode(data)
    assert whole.shape == (3, 3, 40, 50)
    for j in range(3):
        np.testing.assert_array_equal(hwc(whole[j]), decode(data[j]))
    centred = cpu_decoder().decode(data, None, SIZE)
    for j in range(3):
        assert psnr(hwc(centred[j]), decode(data[j], size=SIZE)) >= 35
    with pytest.raises(ValueError, match="different sizes"):
        cpu_decoder().decode([data[0], jpeg(photo(30, 50))])


@pytest.mark.parametrize("mode", ["random", "crop", "pad", "stretch"])
def test_crop_resize_batch_matches_pillow(mode):
    h, w = 72, 96
    images = np.stack([photo(h, w, s) for s in range(6)])
    size = SIZE if mode != "pad" else (64, 40)
    rngs = [np.random.default_rng(s) for s in range(6)]
    plans = [geometry.plan(w, h, size, "crop" if mode == "random" else mode, "random" if mode == "random" else "center",
                           rng) for rng in rngs]
    out = gpu.crop_resize_batch(torch.from_numpy(images).permute(0, 3, 1, 2), plans, size)
    assert out.shape == (6, 3, *size) and out.is_contiguous(memory_format=torch.channels_last)
    for j, p in enumerate(plans):
        ref = np.asarray(apply_plan(Image.fromarray(images[j]), p, size))
        assert psnr(hwc(out[j]), ref) >= 40
    if mode == "random":
        assert any(p.flip for p in plans) and not all(p.flip for p in plans)


def test_crop_resize_batch_is_exact_for_a_plain_crop_and_flip():
    images = torch.from_numpy(np.stack([photo(30, 40, s) for s in range(2)])).permute(0, 3, 1, 2)
    plans = [geometry.Plan((3, 5, 23, 21), (20, 16), (20, 16), (0, 0), flip=f) for f in (False, True)]
    out = gpu.crop_resize_batch(images, plans, (16, 20))
    assert torch.equal(out[0], images[0, :, 5:21, 3:23])
    assert torch.equal(out[1], images[1, :, 5:21, 3:23].flip(2))


# ---- the loader's device path, driven on the CPU -------------------------------------------------------------


def device_path(dataset, batch_size, **options):
    """make_loader's device path on the CPU: nvImageCodec's CPU backend decodes, CPU tensors come out."""
    return device_loader(dataset, batch_size, device=CPU, decode_on="device", backend="cpu", num_workers=0,
                         **options)


def device_plans(monkeypatch):
    """(thread, plan) of every plan the device renders: a loader's are those of its stage's thread (the reader
    threads of earlier tests' loaders may still be making their next epoch's first batch)."""
    import threading
    seen = []
    real_decode, real_crop = gpu.BatchDecoder.decode, gpu.crop_resize_batch

    decoding = threading.local()

    def decode_recording(self, records, plans=None, size=None, heads=None):
        seen.extend((threading.current_thread(), p) for p in plans)
        decoding.now = True
        try:
            return real_decode(self, records, plans, size, heads)
        finally:
            decoding.now = False

    def crop_recording(images, plans, size, params=None):
        if not getattr(decoding, "now", False):  # stored pixels (the decoder's plans are recorded above)
            seen.extend((threading.current_thread(), p) for p in plans)
        return real_crop(images, plans, size, params)
    monkeypatch.setattr(gpu.BatchDecoder, "decode", decode_recording)
    monkeypatch.setattr(gpu, "crop_resize_batch", crop_recording)
    return seen


@pytest.mark.parametrize("store,crop", [("enc", "random"), ("enc", "center"), ("pix", "random")])
def test_device_path_draws_the_cpu_paths_geometry(packs, monkeypatch, store, crop):
    """Two epochs: the same order, labels, boxes and flips as the default loader, pixels >= 40 dB of its
    exact (Pillow's) pixels (the fast path's own are within 35 dB of those: not compared to each other)."""
    ds = open_dataset(packs / store, size=SIZE, crop=crop)
    exact = open_dataset(packs / store, size=SIZE, crop=crop, **({"exact": True} if store == "enc" else {}))
    cpu_plans = []  # the CPU path draws through geometry.plan (Pillow's decode, or its crop of stored pixels)
    monkeypatch.setattr(geometry, "plan", _recorder(geometry.plan, cpu_plans))
    ref_loader = make_loader(exact, 8, seed=5, num_workers=0, decode_threads=1)
    reference = [list(ref_loader) for _ in range(2)]
    monkeypatch.undo()
    recorded = device_plans(monkeypatch)
    loader = device_path(ds, 8, seed=5)
    got = [list(loader) for _ in range(2)]
    dev_plans = [p for thread, p in list(recorded) if thread is loader.pixfeed_device._thread]
    assert "cpu (cpu backend)" in str(loader.pixfeed_plan) and loader.pixfeed_plan.decode_on == "cpu (cpu backend)"
    assert len(dev_plans) in (2 * len(ds), 2 * len(ds) + 8)  # and the third epoch's first batch, made ahead
    assert [tuple(p) for p in dev_plans[:2 * len(ds)]] == [tuple(p) for p in cpu_plans]
    assert not torch.equal(got[0][0][0], got[1][0][0]) or crop == "center"  # epochs draw afresh
    for ref_epoch, got_epoch in zip(reference, got):
        for (ref_images, ref_labels), (images, labels) in zip(ref_epoch, got_epoch):
            assert torch.equal(ref_labels, labels)
            assert images.shape == ref_images.shape and images.is_contiguous(memory_format=torch.channels_last)
            assert min(psnr(hwc(a), hwc(b)) for a, b in zip(images, ref_images)) >= 40


def _recorder(fn, seen):
    def recording(*args, **kwargs):
        p = fn(*args, **kwargs)
        seen.append(p)
        return p
    return recording


def test_device_records_read_bytes_and_plans_not_pixels(packs):
    ds = open_dataset(packs / "enc", size=SIZE, crop="random")
    loader = device_path(ds, 8, seed=1)
    view = loader.dataset.dataset  # under the seeding wrapper
    assert isinstance(view, DeviceRecords) and loader.num_workers == 0
    batch = view.get_batch([0, 1, 2])
    assert all(isinstance(r, (bytes, memoryview)) for r in batch.records) and len(batch.plans) == 3


def test_resume_mid_epoch_gives_the_same_batches(packs):
    ds = open_dataset(packs / "enc", size=SIZE, crop="random")
    loader = device_path(ds, 6, seed=2)
    loader.set_epoch(1)
    whole = list(loader)
    loader = device_path(ds, 6, seed=2)
    loader.set_epoch(1)
    it = iter(loader)
    first = [next(it), next(it)]
    state = loader.state_dict()
    assert state["consumed"] == 12  # batches the loop took, not the ones made ahead
    del it
    resumed = device_path(ds, 6, seed=2)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(first) + len(rest) == len(whole)
    for (a, la), (b, lb) in zip(first + rest, whole):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_output_dtype_normalisation_and_memory_format(packs):
    ds = open_dataset(packs / "pix", size=SIZE, crop="random")
    images = next(iter(device_path(ds, 4, seed=0)))[0]
    floats = next(iter(device_path(ds, 4, seed=0, dtype=torch.float32)))[0]
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    torch.testing.assert_close(floats, (images.float() / 255 - mean) / std)
    assert floats.is_contiguous(memory_format=torch.channels_last)
    half = next(iter(device_path(ds, 4, seed=0, dtype=torch.bfloat16, mean=(0.5,) * 3, std=(0.5,) * 3,
                                 memory_format=torch.contiguous_format)))[0]
    assert half.dtype == torch.bfloat16 and half.is_contiguous()
    torch.testing.assert_close(half.float(), images.float() / 127.5 - 1, atol=0.02, rtol=0)
    with pytest.raises(OptionError, match="dtype=torch.float32"):
        make_loader(ds, 4, device="cpu", mean=(0.5,) * 3, std=(0.5,) * 3)
    with pytest.raises(OptionError, match="device="):
        make_loader(ds, 4, dtype=torch.float32)
    with pytest.raises(OptionError, match="dtype"):
        make_loader(ds, 4, device="cpu", dtype=torch.int32)


def test_device_cpu_gives_the_default_paths_batches(packs):
    ds = open_dataset(packs / "enc", size=SIZE, crop="random")
    default = make_loader(ds, 8, seed=4)
    on_cpu = make_loader(ds, 8, seed=4, device="cpu")
    assert on_cpu.pixfeed_plan.decode_on == "cpu" and default.pixfeed_plan.device is None
    assert "decode_on" not in str(default.pixfeed_plan)
    for (a, la), (b, lb) in zip(default, on_cpu):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_the_stage_makes_one_batch_at_a_time(monkeypatch):
    """An epoch left early may still be making a batch in its reader thread when the next epoch's reader
    starts: the two must not run the stage at once (on CUDA they would share a pinned slot, the side
    stream and its event)."""
    import threading
    stage = DeviceStage(CPU, None, SIZE, torch.uint8, None, None, torch.channels_last)
    inside, most = [0], [0]

    def slow(batch):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        inside[0] -= 1
        return batch
    monkeypatch.setattr(stage, "_make", slow)
    threads = [threading.Thread(target=stage.make, args=(torch.zeros(1),)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def test_cuda_is_cuda_local_rank_under_torchrun_before_the_process_group(monkeypatch):
    """torchrun sets LOCAL_RANK; a loader made before init_process_group (the world still one process)
    must still feed this rank's GPU, not cuda:0; a LOCAL_RANK past the visible devices (one GPU made
    visible per process) leaves the current device."""
    from pixfeed.machine.world import World
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert devicemod.local_rank(World()) == 2 and devicemod.local_rank(World(2, 8)) == 2
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert devicemod.local_rank(World(5, 8)) is None
    monkeypatch.delenv("LOCAL_RANK")
    assert devicemod.local_rank(World(1, 2)) is None


def test_crop_resize_batch_ignores_the_callers_autocast():
    """Called in a training step under bf16 autocast, the two matmuls must stay float32: bf16 keeps 8 bits
    of mantissa, so pixels near 255 would come out several levels off."""
    h, w = 72, 96
    images = torch.from_numpy(np.stack([photo(h, w, s) for s in range(4)])).permute(0, 3, 1, 2)
    plans = [geometry.plan(w, h, SIZE, "crop", "random", np.random.default_rng(s)) for s in range(4)]
    plain = gpu.crop_resize_batch(images, plans, SIZE)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = gpu.crop_resize_batch(images, plans, SIZE)
    assert autocast.dtype == torch.uint8 and torch.equal(autocast, plain)


@pytest.mark.skipif(CUDA, reason="checks the error raised without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_cuda_without_cuda_names_cuda(packs, device):
    ds = open_dataset(packs / "enc", size=SIZE)
    with pytest.raises(OptionError, match="CUDA is not available"):
        make_loader(ds, 4, device=device)
    ok, why = gpu.available(device)
    assert not ok and "CUDA" in why
    with pytest.raises(RuntimeError, match="CUDA"):
        gpu.BatchDecoder(device)


def test_a_dataset_the_device_cannot_make_keeps_the_cpu_path(packs):
    ds = open_dataset(packs / "enc", size=SIZE, transform=lambda x: x)
    loader = device_loader(ds, 4, device=CPU, num_workers=0)
    assert loader.pixfeed_plan.decode_on == "cpu"
    assert next(iter(loader))[0].shape == (4, 3, *SIZE)
    with pytest.raises(OptionError, match="transform"):
        device_path(ds, 4)


def test_plan_rules_for_the_device():
    cuda = torch.device("cuda", 0)
    assert rules.choose_decode_on(cuda, "encoded", 16, (True, "hw"))[0] == "device"
    where, why = rules.choose_decode_on(cuda, "encoded", 64, (True, "hw"))
    assert where == "cpu" and "64 usable CPUs" in why
    assert rules.choose_decode_on(cuda, "encoded", 16, (False, "nvImageCodec is not installed"))[0] == "cpu"
    assert rules.choose_decode_on(cuda, "stored", 2, (False, ""))[0] == "device"
    assert rules.choose_decode_on(CPU, "encoded", 2, (True, ""))[0] == "cpu"
    assert rules.choose_read_ahead("auto", 0, True)[0] is True
    assert rules.choose_read_ahead("auto", 0, False)[0] is False
    assert rules.choose_read_ahead("auto", 3, True)[0] is False
    assert rules.resolve_device(None) is None and rules.resolve_device("cpu") == CPU
    with pytest.raises(OptionError, match="'cpu' or CUDA"):
        rules.resolve_device("meta")


# ---- on a CUDA device (skipped without one) ------------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
def test_gpu_decoder_matches_the_cpu_path(records):
    ok, why = gpu.available("cuda")
    if not ok:
        pytest.skip(why)
    plans = plans_for(records, "random")
    out = gpu.BatchDecoder("cuda").decode(records, plans, SIZE)
    assert out.is_cuda
    scores = [psnr(hwc(out[j]), decode(r, size=SIZE, plan=p, exact=False)) for j, (r, p) in enumerate(zip(records, plans))]
    assert min(scores) >= 35, scores


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("store,crop", [("enc", "random"), ("pix", "random")])
def test_cuda_loader_same_labels_and_flat_memory(packs, store, crop):
    ds = open_dataset(packs / store, size=SIZE, crop=crop)
    loader = make_loader(ds, 8, seed=3, device="cuda", dtype=torch.float16)
    reference = list(make_loader(ds, 8, seed=3))
    peaks, free = [], []
    for epoch in range(4):
        torch.cuda.reset_peak_memory_stats()
        for (images, labels), (ref, ref_labels) in zip(loader, reference if epoch == 0 else [(None, None)] * 99):
            assert images.is_cuda and images.dtype == torch.float16
            if ref is not None:
                assert torch.equal(labels.cpu(), ref_labels)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated())
        time.sleep(0.5)  # the epoch's reader thread ends, and its nvImageCodec decoder with it
        free.append(torch.cuda.mem_get_info()[0])  # the whole device: nvImageCodec's memory is not torch's
    assert peaks[2] <= peaks[1] * 1.05
    assert free[3] >= free[1] - (64 << 20), free  # no decoder or buffers left behind per epoch


def _cuda_batches(loader, busy_cycles: int = 0):
    """Each batch cloned on the training stream, as a step would read it, then dropped; ``busy_cycles``: the
    step still busy (a sleep kernel queued first), so the clone runs long after the batch was handed over."""
    out = []
    for images, labels in loader:
        if busy_cycles:
            torch.cuda._sleep(busy_cycles)
        out.append((images.clone(), labels.clone()))
        del images, labels
    torch.cuda.synchronize()
    return [(a.cpu(), b.cpu()) for a, b in out]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("store", ["enc", "pix"])
def test_cuda_feed_streams_events_and_pinned_ring(packs, monkeypatch, store):
    """The side stream made slow (a sleep kernel before every batch) and the training stream slower: the
    training stream must wait on each batch's event (else it reads unfinished pixels); a batch it dropped
    while its kernels still read it must not be handed to a later batch (record_stream); stored pixels go
    through one pinned slot, which must not be refilled while its copy waits behind the sleep.  The batches
    must be those of an unhurried run."""
    if store == "enc" and not gpu.available("cuda")[0]:
        pytest.skip(gpu.available("cuda")[1])
    ds = open_dataset(packs / store, size=SIZE, crop="random")
    reference = _cuda_batches(device_loader(ds, 2, device="cuda", decode_on="device", seed=3))
    loader = device_loader(ds, 2, device="cuda", decode_on="device", seed=3)
    stage = loader.pixfeed_device
    stage.staging = stage.view.staging = gpu.Staging(stage.device, slots=1)  # stored pixels read into it too
    real = stage._make
    slow = 20_000_000  # about 10 ms of a GPU's clock
    monkeypatch.setattr(stage, "_make", lambda batch: (torch.cuda._sleep(slow), real(batch))[1])
    got = _cuda_batches(loader, busy_cycles=4 * slow)
    assert len(got) == len(reference) == math.ceil(len(ds) / 2)
    for (a, la), (b, lb) in zip(got, reference):
        assert torch.equal(la, lb)
        assert (a.int() - b.int()).abs().max() <= 1  # cuBLAS may round a pixel the other way; garbage is far off


@pytest.mark.gpu
@needs_cuda
def test_gpu_decoder_on_a_side_stream(records):
    """nvImageCodec decodes on the caller's current stream (cuda_stream=), so kernels queued on that stream
    after a slow one see its pixels, and the default stream gets them after wait_stream."""
    if not gpu.available("cuda")[0]:
        pytest.skip(gpu.available("cuda")[1])
    plans = plans_for(records, "random")
    decoder = gpu.BatchDecoder("cuda")
    plain = decoder.decode(records, plans, SIZE)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        out = decoder.decode(records, plans, SIZE)
    torch.cuda.current_stream().wait_stream(side)
    out.record_stream(torch.cuda.current_stream())
    assert torch.equal(out.cpu(), plain.cpu())


def test_available_needs_a_gpu_decoder_that_decodes(monkeypatch):
    """available() makes a decoder with GPU backends only and decodes a JPEG with it: one whose GPU
    decoders did not load (nvJPEG missing: nvImageCodec returns None) is named, not taken for a GPU."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from nvidia import nvimgcodec as n  # its CodeStream and DecodeParams; the decoder is the stand-in below
    asked = []

    class Decoder:
        def __init__(self, result):
            self.result = result

        def decode(self, stream, **kw):
            return self.result

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device", lambda index: nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: SimpleNamespace(
        cuda_stream=0, synchronize=lambda: None))
    for result, ok in ((None, False), (SimpleNamespace(shape=(48, 64, 3)), True)):
        gpu._available.clear()
        monkeypatch.setattr(gpu, "_make_decoder", lambda index, backend, r=result: (
            asked.append(backend), (n, Decoder(r), "hardware JPEG engine"))[1])
        got, why = gpu.available("cuda:0")
        assert got is ok and asked[-1] == "gpu-only"
        assert ("nvJPEG is missing" in why) is not ok and "cuda:0" in why
    gpu._available.clear()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("store", ["enc", "pix"])
def test_the_stage_makes_no_synchronising_call(packs, store):
    """After a first batch (which makes the decoder, the pinned ring and the caching allocator's blocks),
    the stage's batches of JPEGs and of stored pixels make no call that synchronises with the device
    (torch's sync debug mode raises on one: a blocking copy, .item(), a pageable copy of the labels)."""
    if store == "enc" and not gpu.available("cuda")[0]:
        pytest.skip(gpu.available("cuda")[1])
    ds = open_dataset(packs / store, size=SIZE, crop="random")
    loader = device_loader(ds, 4, device="cuda", decode_on="device", seed=3, num_workers=0)
    view, stage = loader.dataset.dataset, loader.pixfeed_device
    jpegs = [i for i in range(len(ds)) if store == "pix" or gpu.gpu_head(bytes(ds.read_checked([i])[1][0]))]
    batches = [view.get_batch(jpegs[k:k + 4]) for k in range(0, 12, 4)]  # JPEGs only: no CPU fallback
    stage.make(batches[0])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        made = [stage.make(b) for b in batches[1:]]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for (images, labels), event in made:
        event.synchronize()
        assert images.shape == (4, 3, *SIZE) and labels.shape == (4,)


def test_an_empty_batch_and_a_mixed_one_come_out_whole(records):
    """No records: an empty batch of the size; JPEGs beside a PNG (the CPU's) and a JPEG larger than the
    padded batch takes (resized alone): every row filled, as each alone would be."""
    dec = gpu.BatchDecoder(CPU, "cpu")
    assert dec.decode([], None, SIZE).shape == (0, 3, *SIZE)
    big = jpeg(photo(120, 150, seed=4))
    png = next(r for r in records if r[:4] == b"\x89PNG")
    small = next(r for r in records if r[:2] == b"\xff\xd8")
    batch = [small, png, big]
    dec.PAD_SIDE = 100  # the 150-pixel JPEG is resized on its own
    together = dec.decode(batch, None, SIZE)
    for j, record in enumerate(batch):
        np.testing.assert_array_equal(together[j].numpy(), dec.decode([record], None, SIZE)[0].numpy())
