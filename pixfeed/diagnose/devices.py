"""torch, CUDA and the host-to-device copy.

``copy_rate`` times ``repeats`` copies of one host tensor to ``device`` (with a
CUDA synchronize around them, so the copies really finished).  The doctor runs
it from pageable and from pinned memory: pinned memory is what lets
``non_blocking=True`` overlap the copy with compute, and it is usually faster too.
"""
from __future__ import annotations

import time
from typing import Optional

import torch

from pixfeed.diagnose.finding import INFO, OK, WARN, Finding, size

PROBE_BYTES = 64 * 2**20
PINNED_GAIN = 1.2  # recommend pinning when it copies this much faster


def check_torch() -> Finding:
    cuda = torch.cuda.is_available()
    devices = [f"{torch.cuda.get_device_name(i)} ({size(torch.cuda.get_device_properties(i).total_memory)})"
               for i in range(torch.cuda.device_count())] if cuda else []
    value = f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}, devices: {', '.join(devices) or 'none'}"
    data = {"torch": torch.__version__, "cuda_build": torch.version.cuda, "devices": devices}
    if cuda:
        return Finding("torch", value, "CUDA is usable", OK, data)
    if torch.version.cuda is None:
        return Finding("torch", value, "CPU-only torch build: install a CUDA build of torch to train on a GPU", WARN, data)
    return Finding("torch", value, "CUDA build but no device visible: check the driver, CUDA_VISIBLE_DEVICES "
                   "and the container's --gpus option", WARN, data)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_rate(tensor: torch.Tensor, device: torch.device, repeats: int = 5) -> float:
    """Bytes per second copying ``tensor`` to ``device`` (after one untimed warm-up copy)."""
    tensor.to(device, copy=True)
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        tensor.to(device, non_blocking=True, copy=True)
    _sync(device)
    return tensor.nbytes * repeats / (time.perf_counter() - start)


def check_bandwidth(batch_bytes: int, nbytes: int = PROBE_BYTES) -> Optional[Finding]:
    """Pinned vs pageable host-to-device rate on CUDA device 0; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda", 0)
    pageable = copy_rate(torch.empty(nbytes, dtype=torch.uint8), device)
    pinned = copy_rate(torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), device)
    ms = batch_bytes / pageable * 1000
    value = f"pageable {pageable / 1e9:.1f} GB/s, pinned {pinned / 1e9:.1f} GB/s ({ms:.1f} ms per batch pageable)"
    data = {"pageable_bytes_per_s": pageable, "pinned_bytes_per_s": pinned}
    if pinned > PINNED_GAIN * pageable:
        return Finding("host-to-device", value, f"pin_memory=True: pinned copies run {pinned / pageable:.1f}x faster "
                       "and can overlap compute (make_loader pins when CUDA is available)", INFO, data)
    return Finding("host-to-device", value, "pinning gains little here; keep non_blocking copies", OK, data)
