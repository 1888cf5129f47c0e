"""GPU decode as its own stage of the stall profile: driven by the counters of pixfeed.image.gpu.stats(),
faked here (a stand-in module in sys.modules) so the logic runs without CUDA."""
from __future__ import annotations

import sys
import types

import pytest
import torch

import pixfeed
from pixfeed.diagnose.report import StallReport, Step
from pixfeed.diagnose.stages import GPU_STAGE, gpu_stats

BATCH = 4


class FakeGpu(types.ModuleType):
    """pixfeed.image.gpu's counters, moved by the loader below as a GPU decoder would move them."""

    def __init__(self):
        super().__init__("pixfeed.image.gpu")
        self.counts = {"gpu_decoded": 0, "cpu_fallback": 0, "gpu_seconds": 0.0}

    def stats(self):
        return dict(self.counts)


class DecodingLoader:
    """Batches whose 'decode' bumps the fake counters: 3 images on the GPU, 1 fallback, 2 ms each batch."""

    def __init__(self, gpu, batches=6, moves=True):
        self.gpu, self.batches, self.moves = gpu, batches, moves

    def __len__(self):
        return self.batches

    def __iter__(self):
        for i in range(self.batches):
            if self.gpu is not None and self.moves:
                self.gpu.counts["gpu_decoded"] += BATCH - 1
                self.gpu.counts["cpu_fallback"] += 1
                self.gpu.counts["gpu_seconds"] += 0.002
            yield torch.zeros(BATCH, 3, 8, 8, dtype=torch.uint8), torch.full((BATCH,), i)


@pytest.fixture
def gpu(monkeypatch):
    fake = FakeGpu()
    monkeypatch.setitem(sys.modules, "pixfeed.image.gpu", fake)
    return fake


def test_gpu_decode_is_its_own_stage_when_the_counters_move(gpu):
    report = pixfeed.profile_loader(DecodingLoader(gpu), steps=5, device=None, warmup=1)
    per_batch = report.per_batch()
    assert GPU_STAGE in per_batch and per_batch[GPU_STAGE] <= report.total("wait") / 5 + 1e-12
    assert report.gpu() == {"gpu_decoded": 5 * 3, "cpu_fallback": 5, "seconds_per_batch": pytest.approx(0.002)}
    assert report.to_dict()["gpu_decode"]["gpu_decoded"] == 15  # the warm-up batch is left out
    text = str(report)
    assert f"wait: {GPU_STAGE}" in text and "GPU decode: 15 images on the GPU, 5 fell back to the CPU" in text


def test_no_gpu_module_no_stage(monkeypatch):
    monkeypatch.delitem(sys.modules, "pixfeed.image.gpu", raising=False)
    assert gpu_stats() == {}
    report = pixfeed.profile_loader(DecodingLoader(None), steps=3, device=None)
    assert GPU_STAGE not in report.per_batch() and "gpu_decode" not in report.to_dict()
    assert "GPU decode" not in str(report)


def test_counters_that_do_not_move_add_no_stage(gpu):
    report = pixfeed.profile_loader(DecodingLoader(gpu, moves=False), steps=3, device=None)
    assert not report.gpu_measured and GPU_STAGE not in report.per_batch()


def test_gpu_time_counts_up_to_the_wait_and_the_rest_is_split_by_stage():
    stages = {"read": 0.001, "decode": 0.003, "transform": 0.0, "collate": 0.0, "other": 0.0}
    held = StallReport([Step(wait=0.010, compute=0.001, images=8, gpu_decode=0.006, gpu_decoded=8)] * 2, stages)
    per_batch = held.per_batch()
    assert per_batch[GPU_STAGE] == pytest.approx(0.006)
    assert per_batch["read"] == pytest.approx(0.001) and per_batch["decode"] == pytest.approx(0.003)
    assert held.dominant == GPU_STAGE and "decoding on the GPU dominates" in held.advice()[0]
    overlapped = StallReport([Step(wait=0.001, compute=0.050, images=8, gpu_decode=0.020, gpu_decoded=8)], stages)
    assert overlapped.per_batch()[GPU_STAGE] == pytest.approx(0.001)  # decode behind the step kept no one waiting
    assert overlapped.per_batch()["decode"] == 0 and overlapped.bound == "compute-bound"


def test_the_cpu_backend_batch_decoder_moves_the_stage(tmp_path):
    """The real counters: pixfeed.image.gpu.BatchDecoder with nvImageCodec's CPU backend (the CI stand-in for
    the GPU one) decodes each batch in the loop; a PNG falls back to the CPU decoder inside the batch."""
    pytest.importorskip("nvidia.nvimgcodec")
    from conftest import write_image
    from pixfeed.image import gpu as gpu_module

    paths = [write_image(tmp_path / f"{i}.jpg", size=(48 + i, 40), seed=i, fmt="JPEG") for i in range(3)]
    paths.append(write_image(tmp_path / "3.png", size=(40, 40), seed=3, fmt="PNG"))
    records = [p.read_bytes() for p in paths]
    decoder = gpu_module.BatchDecoder(torch.device("cpu"), backend="cpu")

    class Decoding:
        def __iter__(self):
            for _ in range(4):
                yield decoder.decode(records, None, (32, 32)), torch.zeros(len(records))

    report = pixfeed.profile_loader(Decoding(), steps=3, device=None, warmup=1)
    assert report.gpu()["gpu_decoded"] == 3 * 3 and report.gpu()["cpu_fallback"] == 3
    assert report.gpu()["seconds_per_batch"] > 0 and GPU_STAGE in report.per_batch()
