"""Is the GPU fed? Each model's appetite beside the same training step fed by a folder baseline, pixfeed's
CPU path and pixfeed's GPU path, from full-size JPEGs, ``--max-side 384`` JPEGs and stored pixels.

    python benchmarks/gpu_feed.py --images DIR [--copies N] [--out results.json] [--seconds S]
                                  [--models resnet50,resnet18] [--batch 256]
    python benchmarks/gpu_feed.py --images DIR --cpu-smoke        # reduced, on the CPU: checks the script

The dataset: DIR's images (an ImageFolder tree, or a flat folder) copied ``--copies`` times (by default
to about 20,000 images) into a temporary folder, then packed three ways with pixfeed (mmap: encoded
full-size, encoded ``--max-side 384``, stored pixels 256).  The training step: a torchvision model
(``weights=None``), bf16 autocast, channels_last, SGD with momentum, cross-entropy, the uint8 batch
normalised on the GPU, ``cudnn.benchmark`` on.  Rows, each time-boxed to ``--seconds`` of measurement:

* appetite: the step on a synthetic uint8 batch already on the GPU (no loader): what the model can eat;
* folder baseline: a DataLoader over the copied JPEG folder, ``RandomResizedCrop(224)`` + flip,
  workers = usable CPUs - 1, pinned memory (torchvision's ImageFolder; where torchvision is missing, a
  stand-in with the same work: Pillow decode, ``pixfeed.image.geometry.random_box``, Pillow's bilinear
  resize of the box, flip);
* pixfeed cpu: ``make_loader(open_dataset(ds, size=224, crop="random"), batch)``, every option "auto",
  batches copied to the GPU with ``non_blocking=True``;
* pixfeed gpu: the same with ``make_loader(..., device="cuda")``: batches arrive on the GPU.

A row first runs a warm-up that drains the batches its loader had ready (workers x prefetch + 2
batches, at least 5, for at most 15 s), then counts images through the step for ``--seconds``.  It reports images/s,
the share of the model's appetite, and the CPU the whole process used meanwhile, in cores busy:
(CPU time of this process and its live child processes, from /proc) / wall time; the appetite row's
figure is the step's own share of that.  ``--models`` may include ``none``: the loaders alone, batches
moved to the GPU and nothing else.  The JSON (``--out``) is rewritten after every row, so a run cut
short keeps what it measured; a row that fails records the error and the run goes on; a row that
would end past ``--budget`` seconds (270) is recorded as skipped.  The rows run in the order: appetites,
the GPU path (the goals' rows first), the CPU path, the baselines, so a short budget loses the
baselines first.  Defaults (``--seconds 6``) fit one GPU in 5 minutes.  Where an appetite was measured
a row also gives ``loader_cores_est``: its cores busy less the step's own (the appetite row's cores
busy times the row's share), the loader's CPU use, which the goal caps at 4 cores.

``--cpu-smoke``: no GPU needed; small images (``--size 64``), batch 4, a few steps per row, the built-in
``tiny-resnet`` (or resnet18 when torchvision is installed); the GPU rows are recorded as skipped with
the reason; torch runs one thread.  Its figures say the script works, not how fast anything is.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from pixfeed.datasets import open_dataset
from pixfeed.image.geometry import random_box
from pixfeed.loaders import make_loader
from pixfeed.loaders.tune import epochs
from pixfeed.machine.cpus import available_cpus
from pixfeed.packers import pack

IMAGE_EXTS = {".jpg", ".jpeg", ".png"}
TARGET_IMAGES = 20_000  # 78 batches of 256 an epoch: the steady rate is counted apart from epoch starts
EPOCH_START_BATCHES = 5  # an epoch's first batches: counted in images_per_s, not in steady_images_per_s
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLASSES = 1000
DATA = {  # name: how it is described (pack_options gives its pack)
    "full": "mmap encoded, full-size JPEGs",
    "max-side": "mmap encoded, --max-side {max_side}",
    "pixels": "mmap stored pixels {pixels}",
}
GOALS = [  # the goals (docs/benchmarks.md): (model, feed, data, least share of appetite)
    ("resnet50", "pixfeed gpu", "full", 0.95), ("resnet18", "pixfeed gpu", "max-side", 0.85),
    ("resnet18", "pixfeed gpu", "pixels", 0.95)]
MAX_CORES = 4  # the goal for the loader's CPU use at those rates, of 16 cores


# ---------------------------------------------------------------- the dataset

def source_images(root: Path) -> List[Path]:
    images = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_EXTS and p.is_file())
    if not images:
        sys.exit(f"gpu_feed.py: no JPEG or PNG images under {root}")
    return images


def copy_tree(images: List[Path], root: Path, dst: Path, copies: int) -> Dict[str, Any]:
    """``copies`` copies of every image in an ImageFolder tree at ``dst`` (a flat source becomes one class)."""
    start, total = time.perf_counter(), 0
    for image in images:
        label = image.parent.name if image.parent != root else "all"
        (dst / label).mkdir(parents=True, exist_ok=True)
        for k in range(copies):
            target = dst / label / f"{image.stem}_c{k}{image.suffix}"
            shutil.copyfile(image, target)
            total += target.stat().st_size
    return {"images": len(images) * copies, "photos": len(images), "copies": copies, "bytes": total,
            "copy_s": round(time.perf_counter() - start, 2)}


def pack_options(kind: str, args: argparse.Namespace) -> Dict[str, Any]:
    if kind == "full":
        return {"store": "encoded"}
    if kind == "max-side":
        return {"store": "encoded", "max_side": args.max_side}
    return {"store": "pixels", "size": args.pixels}


def pack_all(src: Path, work: Path, args: argparse.Namespace, kinds: List[str]) -> Dict[str, Dict[str, Any]]:
    packs = {}
    for kind in kinds:
        options = pack_options(kind, args)
        start = time.perf_counter()
        pack(str(src), str(work / kind), "mmap", **options)
        size = sum(f.stat().st_size for f in (work / kind).rglob("*") if f.is_file())
        packs[kind] = {"path": str(work / kind), "options": options, "bytes": size,
                       "pack_s": round(time.perf_counter() - start, 2),
                       "described": DATA[kind].format(max_side=args.max_side, pixels=args.pixels)}
        print(f"packed {packs[kind]['described']}: {size / 1e6:.0f} MB in {packs[kind]['pack_s']:.1f} s", flush=True)
    return packs


# ---------------------------------------------------------------- models and the step

class TinyResNet(nn.Module):
    """A small ResNet-like model (stem, two residual stages, pooling, linear) for CPU smoke runs."""

    def __init__(self, classes: int = CLASSES, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                   nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width))
        self.down = nn.Sequential(nn.Conv2d(width, 2 * width, 3, 2, 1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU())
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = F.relu(x + self.block(x))
        x = self.down(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def torchvision_or_none():
    try:
        import torchvision
        return torchvision
    except ImportError:
        return None


def build_model(name: str) -> nn.Module:
    if name == "tiny-resnet":
        return TinyResNet()
    tv = torchvision_or_none()
    if tv is None:
        raise RuntimeError(f"model {name!r} needs torchvision, which is not installed here (tiny-resnet does not)")
    return getattr(tv.models, name)(weights=None, num_classes=CLASSES)


Step = Callable[[torch.Tensor, torch.Tensor], None]


def make_step(name: str, device: torch.device) -> Step:
    """One training step of model ``name`` on ``device``: uint8 images normalised there, bf16 autocast,
    channels_last, SGD; 'none' only moves the batch to the device."""
    if name == "none":
        return lambda images, labels: (images.to(device, non_blocking=True), labels.to(device, non_blocking=True))
    model = build_model(name).to(device).to(memory_format=torch.channels_last).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        x = images.float().sub_(mean).div_(std) if images.dtype == torch.uint8 else images.float()
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), labels.long() % CLASSES)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- CPU use, from /proc

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def descendants(pid: str = "self") -> List[str]:
    """Process ids below ``pid`` (the children of each of its threads, recursively)."""
    found: List[str] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            found += [kid, *descendants(kid)]
    return found


def cpu_seconds(pid: str) -> float:
    """User + system CPU seconds of ``pid`` (all its threads), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuMeter:
    """CPU time of this process and its live descendants between ``start`` and ``stop``; a child that exits
    in between loses its time (the loaders' workers live through the measurement)."""

    def start(self) -> "CpuMeter":
        self.self0, self.kids0 = self._self(), {pid: cpu_seconds(pid) for pid in descendants()}
        self.t0 = time.perf_counter()
        return self

    @staticmethod
    def _self() -> float:
        # CLOCK_PROCESS_CPUTIME_ID (every thread, in nanoseconds): os.times() ticks in 10 ms steps, and a short
        # window then read 0 cores busy
        return time.process_time()

    def stop(self) -> Dict[str, float]:
        wall = time.perf_counter() - self.t0
        main = self._self() - self.self0
        kids = sum(cpu_seconds(pid) - self.kids0.get(pid, 0.0) for pid in descendants())
        return {"cores_busy": (main + kids) / wall, "cores_busy_main": main / wall,
                "cores_busy_children": kids / wall}


# ---------------------------------------------------------------- loaders

class FolderBaseline(torch.utils.data.Dataset):
    """What torchvision's ImageFolder + RandomResizedCrop(size) + RandomHorizontalFlip + PILToTensor do,
    with Pillow and torch only: decode, the box of RandomResizedCrop.get_params, a bilinear resize of it."""

    def __init__(self, root: Path, size: int) -> None:
        classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.samples = [(p, i) for i, c in enumerate(classes) for p in sorted((root / c).iterdir())]
        self.size = size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        from PIL import Image
        path, label = self.samples[i]
        rng = np.random.default_rng(int(torch.randint(0, 2**62, ())))  # torch's RNG, seeded per worker
        with Image.open(path) as image:
            image = image.convert("RGB")
        image = image.resize((self.size, self.size), Image.BILINEAR, box=random_box(*image.size, rng))
        if rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(image)).permute(2, 0, 1), label


def baseline_loader(src: Path, args: argparse.Namespace, device: torch.device):
    workers = max(1, available_cpus() - 1)
    tv = None if args.baseline == "pil" else torchvision_or_none()
    if tv is not None:
        t = tv.transforms
        dataset = tv.datasets.ImageFolder(str(src), t.Compose([t.RandomResizedCrop(args.size),
                                                               t.RandomHorizontalFlip(), t.PILToTensor()]))
        how = f"torchvision {tv.__version__} ImageFolder, RandomResizedCrop({args.size}) + flip, {workers} workers"
    else:
        dataset = FolderBaseline(src, args.size)
        how = (f"Pillow + torch stand-in for ImageFolder (torchvision not installed), RandomResizedCrop({args.size}) "
               f"+ flip, {workers} workers")
    loader = torch.utils.data.DataLoader(dataset, args.batch, shuffle=True, drop_last=True, num_workers=workers,
                                         pin_memory=device.type == "cuda", persistent_workers=True)
    return loader, how


def pixfeed_loader(path: str, args: argparse.Namespace, device: Optional[torch.device]):
    dataset = open_dataset(path, size=args.size, crop="random")
    options = {} if device is None else {"device": str(device)}
    loader = make_loader(dataset, args.batch, drop_last=True, **options)
    plan = getattr(loader, "pixfeed_plan", None)
    how = f"make_loader({'' if device is None else f'device={str(device)!r}, '}every option auto)"
    return loader, how, plan


def ready_batches(loader: Any) -> int:
    """Batches a loader may hold ready before the step asks: workers x prefetch, plus the pin/read-ahead queue."""
    workers = getattr(loader, "num_workers", 0) or 0
    prefetch = getattr(loader, "prefetch_factor", None) or 0
    return workers * prefetch + 2




def gpu_stats() -> Dict[str, float]:
    gpu = sys.modules.get("pixfeed.image.gpu")
    if gpu is None:
        try:
            from pixfeed.image import gpu
        except ImportError:
            return {}
    return dict(gpu.stats())


# ---------------------------------------------------------------- measuring a row

def measure(batches: Iterator[Any], step: Step, device: torch.device, args: argparse.Namespace,
            warmup: int) -> Dict[str, Any]:
    """Warm up ``warmup`` batches (at most ``args.warmup_s`` seconds), then count images through ``step``
    for ``args.seconds`` (at most ``args.max_batches``)."""
    start = time.perf_counter()
    images, labels = next(batches)
    step(images, labels)
    sync(device)
    first = time.perf_counter() - start
    warmed = 1
    while warmed < warmup and time.perf_counter() - start < args.warmup_s:
        step(*next(batches)[:2])
        warmed += 1
    sync(device)
    gpu0, cpu = gpu_stats(), CpuMeter().start()
    t0, count, steps = time.perf_counter(), 0, 0
    place = getattr(batches, "place", None)  # (epoch, batch of the epoch) of the batch last given, if it says
    starts, last, steady = 0, t0, [0, 0.0]  # steady: images and seconds of batches past an epoch's first few
    while time.perf_counter() - t0 < args.seconds and (args.max_batches is None or steps < args.max_batches):
        images, labels = next(batches)[:2]
        step(images, labels)
        count, steps = count + len(images), steps + 1
        now = time.perf_counter()
        if place is not None:
            starts += place[1] == 0
            if place[1] >= EPOCH_START_BATCHES:
                steady[0], steady[1] = steady[0] + len(images), steady[1] + now - last
        last = now
    sync(device)
    wall = time.perf_counter() - t0
    row = {"images_per_s": count / wall, "images": count, "batches": steps, "seconds": wall,
           "warmup_batches": warmed, "first_batch_s": first, **cpu.stop()}
    if place is not None:  # an epoch's first batches wait for its start: counted apart
        row["epoch_starts"] = starts
        row["steady_images_per_s"] = steady[0] / steady[1] if steady[1] else None
    gpu1 = gpu_stats()
    if gpu1:
        row["gpu_stats"] = {k: gpu1.get(k, 0) - gpu0.get(k, 0) for k in gpu1}
    return row


def appetite(step: Step, device: torch.device, args: argparse.Namespace) -> Dict[str, Any]:
    images = torch.randint(0, 256, (args.batch, 3, args.size, args.size), dtype=torch.uint8, device=device)
    labels = torch.randint(0, CLASSES, (args.batch,), device=device)
    return measure(iter(lambda: (images, labels), None), step, device, args, args.appetite_warmup)


class Placed:
    """The loader's batches epoch after epoch (``tune.epochs``), saying where the last one came from:
    ``place`` is [epoch, batch of the epoch]."""

    def __init__(self, loader: Any) -> None:
        self.batches = epochs(loader)
        try:
            self.length = len(loader)
        except TypeError:  # a loader without a length: where a batch came from is not known
            self.length = None
        self.place = [0, -1] if self.length else None

    def __iter__(self) -> "Placed":
        return self

    def __next__(self) -> Any:
        batch = next(self.batches)
        if self.place is not None:
            self.place[1] += 1
            if self.place[1] >= self.length:
                self.place[0], self.place[1] = self.place[0] + 1, 0
        return batch

    def close(self) -> None:
        self.batches.close()


def fed(loader: Any, step: Step, device: torch.device, args: argparse.Namespace) -> Dict[str, Any]:
    batches = Placed(loader)
    try:
        return measure(batches, step, device, args, max(args.min_warmup, ready_batches(loader)))
    finally:
        batches.close()


# ---------------------------------------------------------------- the run

class Results:
    """The run's JSON, rewritten (atomically) after every row."""

    def __init__(self, path: Path, head: Dict[str, Any]) -> None:
        self.path, self.data = path, {**head, "rows": [], "finished": False}

    def add(self, row: Dict[str, Any]) -> None:
        self.data["rows"].append(row)
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


def version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine(device: torch.device) -> Dict[str, Any]:
    tv = torchvision_or_none()
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "torchvision": getattr(tv, "__version__", None), "gpu": torch.cuda.get_device_name(device)
            if device.type == "cuda" else None, "cpus": os.cpu_count(), "usable_cpus": available_cpus(),
            "nvimgcodec": version("nvidia-nvimgcodec-cu13") or version("nvidia-nvimgcodec-cu12"),
            "simplejpeg": version("simplejpeg"), "pixfeed": version("pixfeed")}


def plan_of(plan: Any) -> Optional[Dict[str, Any]]:
    if plan is None:
        return None
    keep = ("device", "decode_on", "num_workers", "decode_threads", "read_ahead", "pin_memory", "prefetch_factor")
    return {**{k: getattr(plan, k, None) for k in keep}, "reasons": dict(getattr(plan, "reasons", {}))}


def gpu_path_missing() -> Optional[str]:
    """Why pixfeed's GPU path cannot run here, or None."""
    import inspect
    if "device" not in inspect.signature(make_loader).parameters:
        return "this pixfeed's make_loader has no device= (the GPU path is not built)"
    return None


class Run:
    def __init__(self, args: argparse.Namespace, device: torch.device, results: Results, src: Path,
                 packs: Dict[str, Dict[str, Any]], started: float) -> None:
        self.args, self.device, self.results, self.src, self.packs = args, device, results, src, packs
        self.start, self.appetites, self.steps = started, {}, {}

    def step(self, model: str) -> Step:
        if model not in self.steps:
            self.steps[model] = make_step(model, self.device)
        return self.steps[model]

    def row(self, model: str, feed: str, data: Optional[str], measure_row: Callable[[], Dict[str, Any]],
            skip: Optional[str] = None) -> None:
        described = "synthetic uint8 batch on the device" if data is None else self.packs.get(data, {}).get(
            "described", "JPEG folder")
        row: Dict[str, Any] = {"model": model, "feed": feed, "data": data or "synthetic", "described": described}
        left = math.inf if self.args.budget is None else self.args.budget - (time.perf_counter() - self.start)
        if skip is None and left < self.args.seconds + 10:
            skip = f"time budget: {left:.0f} s of --budget {self.args.budget:g} left"
        if skip is not None:
            row.update(status="skipped", reason=skip)
        else:
            try:
                row.update(measure_row(), status="ok")
            except Exception as error:  # a failing row is recorded; the others still run
                row.update(status="failed", reason=f"{type(error).__name__}: {error}".splitlines()[0][:500])
            gc.collect()
        if row.get("status") == "ok":
            base = self.appetites.get(model)
            row["share"] = row["images_per_s"] / base["images_per_s"] if base else None
            if base:  # the step's own CPU at this rate, taken out: what the loader used
                row["loader_cores_est"] = max(0.0, row["cores_busy"] - base["cores_busy"] * row["share"])
            if feed == "appetite":
                self.appetites[model] = row
        self.results.add(row)
        print(line(row), flush=True)

    def appetite_row(self, model: str) -> None:
        if model == "none":
            return
        self.row(model, "appetite", None, lambda: appetite(self.step(model), self.device, self.args))

    def pixfeed_row(self, model: str, kind: str, on_gpu: bool, skip: Optional[str]) -> None:
        def run() -> Dict[str, Any]:
            loader, how, plan = pixfeed_loader(self.packs[kind]["path"], self.args,
                                               self.device if on_gpu else None)
            try:
                return {"loader": how, "plan": plan_of(plan), **fed(loader, self.step(model), self.device, self.args)}
            finally:
                del loader
        self.row(model, "pixfeed gpu" if on_gpu else "pixfeed cpu", kind, run, skip)

    def baseline_row(self, model: str) -> None:
        def run() -> Dict[str, Any]:
            loader, how = baseline_loader(self.src, self.args, self.device)
            try:
                return {"loader": how, **fed(loader, self.step(model), self.device, self.args)}
            finally:
                del loader
        self.row(model, "folder baseline", "folder", run)


def line(row: Dict[str, Any]) -> str:
    head = f"{row['model']:<11} {row['feed']:<16} {row['described'][:38]:<38}"
    if row["status"] != "ok":
        return f"{head} {row['status']}: {row['reason']}"
    share = f"{row['share']:.2f} of appetite" if row.get("share") else ""
    return f"{head} {row['images_per_s']:9,.0f} img/s  {share:<17} cores busy {row['cores_busy']:.1f}"


def goals(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    found = []
    for model, feed, data, least in GOALS:
        row = next((r for r in rows if (r["model"], r["feed"], r["data"]) == (model, feed, data)), None)
        share = row.get("share") if row else None
        cores = row.get("loader_cores_est") if row else None
        found.append({"model": model, "feed": feed, "data": data, "least_share": least, "share": share,
                      "loader_cores_est": cores, "max_cores": MAX_CORES,
                      "met": None if share is None or cores is None else bool(share >= least and cores <= MAX_CORES)})
    return found


def plan_rows(run: Run, models: List[str], gpu_skip: Optional[str]) -> None:
    """Appetites first, then the GPU path (the goals' rows first), the CPU path, the baselines."""
    kinds = list(run.packs)
    for model in models:
        run.appetite_row(model)
    order = [(m, d) for m, _, d, _ in GOALS if m in models and d in kinds]
    order += [(m, d) for m in models for d in kinds if (m, d) not in order]
    for model, kind in order:
        run.pixfeed_row(model, kind, True, gpu_skip)
    for model in models:
        for kind in kinds:
            run.pixfeed_row(model, kind, False, None)
    if "folder" in run.args.data:
        for model in models:
            run.baseline_row(model)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", required=True, type=Path, help="folder of JPEGs (ImageFolder tree or flat)")
    p.add_argument("--copies", type=int, help=f"copies of each image (default: to about {TARGET_IMAGES:,} images; "
                                              "--cpu-smoke: to about 24)")
    p.add_argument("--out", type=Path, default=Path("gpu_feed.json"), help="JSON results (default gpu_feed.json)")
    p.add_argument("--seconds", type=float, help="measured seconds per row (default 6; --cpu-smoke 1)")
    p.add_argument("--models", help="comma-separated torchvision models, tiny-resnet, or none (the loaders alone); "
                                    "default resnet50,resnet18 (--cpu-smoke: resnet18 with torchvision, else tiny-resnet)")
    p.add_argument("--batch", type=int, help="batch size (default 256; --cpu-smoke 4)")
    p.add_argument("--size", type=int, help="crop size (default 224; --cpu-smoke 64)")
    p.add_argument("--max-side", type=int, help="--max-side of the second pack (default 384; --cpu-smoke 96)")
    p.add_argument("--pixels", type=int, help="stored pixel size of the third pack (default 256; --cpu-smoke 72)")
    p.add_argument("--data", default="folder,full,max-side,pixels",
                   help="which of folder (the baseline), full, max-side, pixels to measure (default all)")
    p.add_argument("--baseline", choices=("auto", "pil"), default="auto",
                   help="folder baseline: torchvision's ImageFolder when installed (auto), or the Pillow stand-in")
    p.add_argument("--device", default="cuda", help="CUDA device (default cuda)")
    p.add_argument("--budget", type=float, help="seconds from the start: a row that cannot finish its --seconds "
                                                "plus 10 s of warm-up within them is skipped (default 270; "
                                                "--cpu-smoke: none)")
    p.add_argument("--max-batches", type=int, help="at most this many measured batches per row (--cpu-smoke 3)")
    p.add_argument("--workdir", type=Path, help="where the copies and packs go (default: a temporary folder, removed)")
    p.add_argument("--cpu-smoke", action="store_true", help="reduced run on the CPU: checks the script, not speed")
    args = p.parse_args(argv)
    smoke = args.cpu_smoke
    defaults = dict(seconds=1.0 if smoke else 6.0, batch=4 if smoke else 256, size=64 if smoke else 224,
                    max_side=96 if smoke else 384, pixels=72 if smoke else 256, budget=None if smoke else 270.0,
                    max_batches=3 if smoke else None)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.models is None:
        args.models = ("resnet18" if torchvision_or_none() else "tiny-resnet") if smoke else "resnet50,resnet18"
    args.data = [d.strip() for d in args.data.split(",") if d.strip()]
    unknown = set(args.data) - {"folder", *DATA}
    if unknown:
        p.error(f"--data: unknown {', '.join(sorted(unknown))}; expected folder, full, max-side, pixels")
    args.warmup_s = 2.0 if smoke else 15.0
    args.min_warmup = 1 if smoke else 5
    args.appetite_warmup = 1 if smoke else 10
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu_smoke:
        sys.exit("gpu_feed.py measures feeding a GPU and needs CUDA; none is usable here. "
                 "--cpu-smoke runs a reduced version on the CPU to check the script.")
    device = torch.device("cpu") if args.cpu_smoke else torch.device(args.device)
    if args.cpu_smoke:  # one torch thread: a CPU step beside loader workers on a small machine, without OpenMP spinning
        torch.set_num_threads(1)
    gpu_skip = "--cpu-smoke: no GPU rows on the CPU" if args.cpu_smoke else gpu_path_missing()
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    images = source_images(args.images)
    copies = args.copies or max(1, round((24 if args.cpu_smoke else TARGET_IMAGES) / len(images)))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="gpu_feed_"))
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    results = Results(args.out, {"benchmark": "gpu_feed", "mode": "cpu-smoke" if args.cpu_smoke else "gpu",
                                 "machine": machine(device), "config": {k: v for k, v in vars(args).items()},
                                 "gpu_rows": gpu_skip or "measured"})
    started = time.perf_counter()
    try:
        results.data["dataset"] = copy_tree(images, args.images, work / "src", copies)
        print(f"{results.data['dataset']['images']:,} images ({copies} copies of {len(images)}), "
              f"{results.data['dataset']['bytes'] / 1e9:.2f} GB in {work}", flush=True)
        results.data["packs"] = pack_all(work / "src", work, args, [d for d in args.data if d in DATA])
        results.write()
        plan_rows(Run(args, device, results, work / "src", results.data["packs"], started), models, gpu_skip)
        results.data.update(goals=goals(results.data["rows"]), finished=True)
        for goal in results.data["goals"]:
            got = "unmeasured" if goal["share"] is None else (
                f"{goal['share']:.2f} of appetite, loader ~{goal['loader_cores_est']:.1f} cores: "
                f"{'met' if goal['met'] else 'not met'}")
            print(f"goal {goal['model']} {goal['feed']} {goal['data']} >= {goal['least_share']:.2f} of appetite "
                  f"on <= {MAX_CORES} cores: {got}")
    finally:
        results.data["elapsed_s"] = round(time.perf_counter() - started, 1)
        results.write()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {args.out} ({results.data['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
