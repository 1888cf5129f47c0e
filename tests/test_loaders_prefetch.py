"""DevicePrefetcher: the same conversion on every device; overlap checked on CUDA."""
from __future__ import annotations

import pytest
import torch

from pixfeed.errors import OptionError
from pixfeed.loaders import DevicePrefetcher, make_loader
from pixfeed.loaders._testing import ArrayDataset, random_images

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def expected(images):
    scaled = images.float() / 255
    return (scaled - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


@pytest.fixture
def loader():
    return make_loader(ArrayDataset(random_images(10)), 4, shuffle=False)


def devices():
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]  # "cuda" without CUDA raises (below)


@pytest.mark.parametrize("device", devices())
def test_converts_and_normalises(loader, device):
    prefetched = list(DevicePrefetcher(loader, device, mean=MEAN, std=STD))
    assert len(prefetched) == len(loader) == 3
    for (images, labels), (raw, raw_labels) in zip(prefetched, loader):
        assert images.dtype == torch.float32 and images.device.type == device
        torch.testing.assert_close(images.cpu(), expected(raw))
        assert torch.equal(labels.cpu(), raw_labels)


def test_without_mean_scales_to_unit_range_and_keeps_channels_last(loader):
    images, _ = next(iter(DevicePrefetcher(loader, "cpu", dtype=torch.float16)))
    raw, _ = next(iter(loader))
    assert images.dtype == torch.float16 and float(images.max()) <= 1.0
    channels_last = torch.channels_last
    assert images.is_contiguous(memory_format=channels_last) == raw.is_contiguous(memory_format=channels_last)
    torch.testing.assert_close(images, raw.half() / 255)


def test_does_not_modify_float_input():
    batch = (torch.full((2, 3, 4, 4), 0.5), torch.zeros(2))
    images, _ = next(iter(DevicePrefetcher([batch], "cpu", mean=(0.5, 0.5, 0.5), std=(1, 1, 1))))
    assert torch.equal(batch[0], torch.full((2, 3, 4, 4), 0.5)) and float(images.abs().max()) == 0


@pytest.mark.parametrize("options, match", [
    ({"mean": MEAN}, "mean and std"),
    ({"mean": MEAN, "std": (1, 0, 1)}, "std must not contain 0"),
    ({"mean": [[0.5]], "std": [[0.5]]}, "one value per channel"),
])
def test_bad_normalisation_is_refused(loader, options, match):
    with pytest.raises(OptionError, match=match):
        DevicePrefetcher(loader, "cpu", **options)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_cuda_without_cuda_raises_naming_cuda(loader, monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(OptionError, match="CUDA is not available") as raised:
        DevicePrefetcher(loader, device, mean=MEAN, std=STD)
    assert "device='cpu'" in str(raised.value)


def test_cuda_index_past_the_last_device_raises(loader, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(OptionError, match=r"no such CUDA device.*has 2 \(cuda:0 to cuda:1\)"):
        DevicePrefetcher(loader, "cuda:2")


def test_cpu_device_stays_on_the_cpu_whatever_cuda_says(loader, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    images, _ = next(iter(DevicePrefetcher(loader, torch.device("cpu"))))
    assert images.device.type == "cpu" and images.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_are_ready_on_the_current_stream(loader):
    pinned = make_loader(ArrayDataset(random_images(64, 64, 64)), 16, shuffle=False, pin_memory=True)
    for (images, _), (raw, _) in zip(DevicePrefetcher(pinned, "cuda", mean=MEAN, std=STD), pinned):
        torch.cuda.current_stream().synchronize()
        torch.testing.assert_close(images.cpu(), expected(raw))
