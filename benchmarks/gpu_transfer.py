"""Host-to-device bandwidth, pageable vs pinned, and the overlap DevicePrefetcher achieves.

    python benchmarks/gpu_transfer.py [--batch-size 256] [--side 224]

Needs CUDA; elsewhere it exits with a message.  It reports GB/s for a uint8
batch copied from pageable and from pinned memory, then times an epoch of a
stand-in training step (matmuls sized to take about as long as one copy):
copy then step, serially, vs through DevicePrefetcher.  Overlap is the share
of the copy time hidden behind steps: 1.0 means fully hidden.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Iterable

import torch

from pixfeed.loaders import DevicePrefetcher


def cuda_seconds(work: Callable[[], None], repeat: int) -> float:
    work()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        work()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def step_for(seconds: float) -> Callable[[torch.Tensor], None]:
    """A stand-in training step that keeps the GPU busy for about ``seconds``."""
    weight = torch.randn(4096, 4096, device="cuda")
    once = cuda_seconds(lambda: weight @ weight, 5)
    matmuls = max(1, round(seconds / once))

    def step(images: torch.Tensor) -> None:
        for _ in range(matmuls):
            weight @ weight
    return step


def epoch_seconds(batches: Iterable, step: Callable[[torch.Tensor], None]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for images, _ in batches:
        step(images)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_transfer.py measures host-to-device copies and needs a CUDA GPU; none is available here.")
    shape = (args.batch_size, 3, args.side, args.side)
    pageable = torch.randint(0, 256, shape, dtype=torch.uint8)
    pinned = pageable.pin_memory()
    gigabytes = pageable.numel() / 1e9
    for name, host in (("pageable", pageable), ("pinned", pinned)):
        seconds = cuda_seconds(lambda: host.to("cuda", non_blocking=True), 10)
        print(f"{name:<9} uint8 host-to-device: {gigabytes / seconds:6.1f} GB/s")
    copy = cuda_seconds(lambda: pinned.to("cuda", non_blocking=True).float().div_(255), 10)
    step = step_for(copy)
    loader = [(pinned, torch.zeros(args.batch_size))] * args.batches
    serial = epoch_seconds(((images.to("cuda").float().div_(255), labels) for images, labels in loader), step)
    overlapped = epoch_seconds(DevicePrefetcher(loader, "cuda"), step)
    hidden = (serial - overlapped) / (copy * args.batches)
    print(f"epoch of {args.batches} batches: serial {serial * 1e3:.1f} ms, prefetched {overlapped * 1e3:.1f} ms, "
          f"overlap {hidden:.2f} of the copy time hidden")


if __name__ == "__main__":
    main()
