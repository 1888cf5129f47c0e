"""The device stage's host cost per image, measured without a GPU (issue #45, item 7).

    python benchmarks/gpu_host.py --images DIR [--batch 256] [--batches 6] [--pixels 256] [--out gpu_host.json]

What ``make_loader(ds, batch, device="cuda")`` does on the host for each batch, timed as this thread's CPU
time (``time.thread_time``), for a batch of ``--batch`` full-size JPEGs (DIR's images, packed mmap encoded,
repeated to fill a batch) and of stored ``--pixels`` x ``--pixels`` pixels (packed mmap pixels), both read
with ``size=224, crop="random"``:

* read: ``read_checked`` of the batch (the pack's read and its checksums), the same as the CPU path's
  (stored pixels: gathered into a given array, as ``get_batch`` gathers them into the pinned slot);
* plans: the rest of ``DeviceRecords.get_batch``: one draw for the batch, each JPEG header parsed once,
  the batch's plans in one vectorised step;
* stage: ``DeviceStage._make``: the decoder's host work (code streams, region boxes, the batch padded and
  resized by banded weights built on the host) or the stored pixels' weights, the small arrays staged
  (stored pixels are read straight into a reserved slot, ``gpu.Staging.reserve``: not copied again).

The GPU is replaced by PyTorch's ``meta`` device (tensors with shapes and no data: every torch call is
dispatched, none computes) and nvImageCodec's decode by a stand-in that returns a ``meta`` tensor of the
size the decoder would give (the box of a region decode); the code streams are nvImageCodec's own when it
is installed.  So the figures are the Python and dispatch cost per image without the GPU's work; a CUDA
launch costs a few µs more than a ``meta`` dispatch, so the number of torch calls (``ops``, of which
``kernels`` are not views) per batch is reported too.  The reference measured in the same run: the CPU
path's own ``get_batch`` of the same batch (decode, crop, resize on this core), per image.  The rate one
core sustains is 1e6 / (read + plans + stage) µs.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pixfeed.datasets import open_dataset
from pixfeed.image import gpu, region
from pixfeed.loaders.device import ENCODED, STORED, DeviceRecords, DeviceStage
from pixfeed.packers import pack
from pixfeed.seeds import seeded_by_index

META = torch.device("meta")
LAUNCH_US, VIEW_US = 8.0, 2.0  # host time of one eager CUDA kernel launch, of one view (assumed, not measured)
IMAGE_EXTS = {".jpg", ".jpeg"}


class _Image:
    """What the stand-in decoder returns: the size nvImageCodec's image would have."""

    def __init__(self, height: int, width: int) -> None:
        self.shape = (height, width, 3)


class _Streams:
    """nvImageCodec's module where it is installed (its ``CodeStream``, ``Region``), else a stand-in."""

    class CodeStream:
        def __init__(self, data) -> None:
            self.data = data

        def get_sub_code_stream(self, region) -> "_Streams.CodeStream":
            return self

    @staticmethod
    def Region(*box):  # noqa: N802 - nvImageCodec's name
        return box


class StandInDecoder(gpu.BatchDecoder):
    """``BatchDecoder`` on the ``meta`` device whose decode returns tensors of the right size and no data."""

    def __init__(self) -> None:  # no decoder made, no device checked
        self.device, self.backend, self.region, self.cpu_threads = META, "stand-in", True, 1
        self.what, self._codec_of, self._lock = "stand-in", None, threading.Lock()
        self.staging = HostStaging()
        self._expected: List[tuple] = []

    def _codec(self):
        if region.available():
            from nvidia import nvimgcodec
            return nvimgcodec, None, None
        return _Streams, None, None

    def _gpu_images(self, records, heads, plans):
        # the sizes nvImageCodec would return, in the order the streams are made: a region decode's box
        self._expected = []
        for j, head in enumerate(heads):
            if head is None:
                continue
            box = plans.box[j] if plans is not None else None
            if plans is not None and plans.random and head.orientation in (0, 1):
                self._expected.append((int(box[3] - box[1]), int(box[2] - box[0])))
            else:
                self._expected.append((head.height, head.width))
        return super()._gpu_images(records, heads, plans)

    def _run(self, decoder, streams, params) -> list:
        return [_Image(*size) for size in self._expected[:len(streams)]]

    def _tensor(self, img) -> Optional[torch.Tensor]:
        return torch.empty(img.shape, dtype=torch.uint8, device=META)


class Counting(TorchDispatchMode):
    """Counts the torch calls dispatched, those that are not views (each a kernel on a GPU), and the time
    spent inside them (on ``meta``: shape functions, some written in Python, that a GPU does not run)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.kernels = 0
        self.seconds = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.thread_time()
        self.ops += 1
        self.kernels += not func.is_view
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.seconds += time.thread_time() - start


class HostStaging(gpu.Staging):
    """``Staging`` on ``meta`` with its slots in host memory (not pinned): what is sent is copied into a slot,
    or read into a reserved one, as on CUDA; the copy to the device is a ``meta`` tensor of each array."""

    def __init__(self) -> None:
        super().__init__(META)
        self.staged = True

    def _buffer(self, nbytes: int) -> torch.Tensor:
        return torch.zeros(nbytes, dtype=torch.uint8)  # its pages touched: resident, as pinned memory is

    def _ship(self, k, end, arrays, offsets):
        return [torch.empty(a.shape, dtype=gpu._TORCH[a.dtype], device=META) for a in arrays]


def pack_sources(images: Path, work: Path, pixels: int) -> Dict[str, Path]:
    files = sorted(p for p in images.rglob("*") if p.suffix.lower() in IMAGE_EXTS)
    if not files:
        raise SystemExit(f"{images}: no JPEGs")
    src = work / "src"
    for i, f in enumerate(files):
        (src / "c").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, src / "c" / f"{i:06d}.jpg")
    packs = {ENCODED: work / "enc", STORED: work / "pix"}
    pack(src, packs[ENCODED], "mmap", store="encoded")
    pack(src, packs[STORED], "mmap", store="pixels", size=f"{pixels}x{pixels}")
    return packs


def measure(path: Path, kind: str, batch: int, batches: int, cpu_reference: bool) -> Dict[str, Any]:
    ds = open_dataset(path, size=224, crop="random")
    view = DeviceRecords(ds, kind)
    stage = DeviceStage(META, kind, ds.size, torch.uint8, None, None, torch.channels_last)
    stage._decoder = StandInDecoder()
    stage.staging = view.staging = HostStaging()  # stored pixels read into its slots, as make_loader does
    rng = np.random.default_rng(0)
    into = {"out": np.empty((batch, *ds.stored_shape), np.uint8)} if kind == STORED else {}  # as into a slot
    times = {"read": 0.0, "plans": 0.0, "stage": 0.0, "torch": 0.0}
    ops = kernels = 0
    warm = len(stage.staging.buffers)  # not counted: the first batches warm up and fill the ring's slots once
    for b in range(batches + warm):
        idx = rng.integers(0, len(ds), batch)
        with seeded_by_index(0, b):
            ds.read_checked(idx, **into)  # the pages in memory, as in a steady epoch
            t0 = time.thread_time()
            ds.read_checked(idx, **into)
            t1 = time.thread_time()
            made = view.get_batch(idx)
            t2 = time.thread_time()
            images, _ = stage._make(made)
            t3 = time.thread_time()
            with Counting() as counted:  # again, to count the torch calls and the time inside them
                stage._make(made)
        if b >= warm:
            times["read"] += t1 - t0
            times["plans"] += max((t2 - t1) - (t1 - t0), 0.0)  # get_batch reads the batch too
            times["stage"] += max(t3 - t2 - counted.seconds, 0.0)
            times["torch"] += counted.seconds
            ops, kernels = ops + counted.ops, kernels + counted.kernels
    assert tuple(images.shape) == (batch, 3, 224, 224), images.shape
    us = {k: v / (batches * batch) * 1e6 for k, v in times.items()}
    ops, kernels = ops / batches, kernels / batches
    host = us["plans"] + us["stage"]
    estimate = host + (kernels * LAUNCH_US + (ops - kernels) * VIEW_US) / batch
    row = {"kind": kind, "batch": batch, "batches": batches, **{f"{k}_us": round(v, 2) for k, v in us.items()},
           "host_us_per_image": round(host, 2), "ops_per_batch": round(ops), "kernels_per_batch": round(kernels),
           "cuda_estimate_us_per_image": round(estimate, 2), "one_core_img_per_s": round(1e6 / estimate),
           "gpu_region_decodes": gpu.stats()["gpu_region"]}
    if cpu_reference:
        t0 = time.thread_time()
        with seeded_by_index(0, 1):
            ds.get_batch(rng.integers(0, len(ds), batch))
        row["cpu_path_us_per_image"] = round((time.thread_time() - t0) / batch * 1e6, 2)
        row["estimate_share_of_cpu_path"] = round(estimate / row["cpu_path_us_per_image"], 4)
    return row


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", required=True, type=Path, help="folder of JPEGs (searched recursively)")
    p.add_argument("--batch", type=int, default=256, help="batch size (default 256)")
    p.add_argument("--batches", type=int, default=6, help="measured batches per kind (default 6)")
    p.add_argument("--pixels", type=int, default=256, help="side of the stored pixels (default 256)")
    p.add_argument("--no-cpu-reference", action="store_true", help="skip the CPU path's get_batch reference")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    p.add_argument("--workdir", type=Path, help="where the packs go (default: a temporary folder, removed)")
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="gpu_host-"))
    try:
        packs = pack_sources(args.images, work, args.pixels)
        rows = [measure(packs[kind], kind, args.batch, args.batches, not args.no_cpu_reference)
                for kind in (ENCODED, STORED)]
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{'kind':8} {'read':>7} {'plans':>7} {'stage':>7} {'host':>7} {'est.':>7} µs/image   {'ops':>5} "
          f"{'kernels':>7} /batch   {'1 core':>7} img/s   {'cpu path':>8} µs/image")
    for r in rows:
        print(f"{r['kind']:8} {r['read_us']:7.1f} {r['plans_us']:7.1f} {r['stage_us']:7.1f} "
              f"{r['host_us_per_image']:7.1f} {r['cuda_estimate_us_per_image']:7.1f}            "
              f"{r['ops_per_batch']:5d} {r['kernels_per_batch']:7d}          {r['one_core_img_per_s']:7d}         "
              f"{r.get('cpu_path_us_per_image', 0):8.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rows": rows, "python": sys.version.split()[0],
                                        "torch": torch.__version__}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
