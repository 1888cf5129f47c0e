"""Reading through a DataLoader into a loop that only touches each batch.

``FolderDataset`` is the baseline a user has today: a torchvision-ImageFolder-
style dataset over the source files (PIL open, convert to RGB, resize the
short side, center crop), written out here so the benchmark needs no torchvision.
"""
from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image

from ..decode import Size, resize
from ..source import scan
from .procstats import ProcUsage


class FolderDataset(torch.utils.data.Dataset):
    """ImageFolder-style: ``(uint8 CHW RGB tensor, label)`` straight from the image files."""

    def __init__(self, root: Path, size: Size) -> None:
        source = scan(root)
        self.files = [source.root / p for p in source.paths]
        self.labels = source.labels.tolist()
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as img:
            img = resize(img.convert("RGB"), self.size, "crop")
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), self.labels[i]


def _epoch(loader, usage: ProcUsage) -> dict:
    images = nbytes = 0
    first: Optional[float] = None
    start = time.perf_counter()
    for batch, labels in loader:
        first = first if first is not None else time.perf_counter() - start
        images += int(labels.numel())
        nbytes += batch.numel() * batch.element_size()
        batch[0, 0, 0, 0].item()  # touch: the loop a GPU step would run, minus the step
        usage.sample(force=images == int(labels.numel()))
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 4), "images": images, "first_batch_s": round(first or seconds, 4),
            "images_per_s": round(images / seconds, 1), "mb_per_s": round(nbytes / seconds / 1e6, 1),
            "bytes": nbytes}


def read_epochs(make: Callable[[], torch.utils.data.DataLoader], epochs: int,
                limit: Callable[[int], dict], before_epoch: Optional[Callable[[], None]] = None) -> dict:
    """Build a loader with ``make`` and read ``epochs`` epochs: per-epoch rates, peaks, CPU time.

    ``limit(workers)`` measures the row's ceiling just before the first epoch,
    so that the ratio compares figures taken under the same machine load.
    """
    loader = make()
    ceiling = limit(loader.num_workers)
    usage = ProcUsage().start()
    plan = getattr(loader, "pixfeed_plan", None)
    workers = loader.num_workers
    per_epoch: List[dict] = []
    for _ in range(epochs):
        if before_epoch is not None:
            before_epoch()
        per_epoch.append(_epoch(loader, usage))
    usage.mark()
    del loader
    if workers:
        gc.collect()  # shuts persistent workers down, so their CPU time is counted
    best = max(per_epoch, key=lambda e: e["images_per_s"])
    return {"ceiling": ceiling, "epochs": per_epoch, "images_per_s": best["images_per_s"], "mb_per_s": best["mb_per_s"],
            "first_batch_s": per_epoch[0]["first_batch_s"], "workers": workers,
            "plan": None if plan is None else {k: str(getattr(plan, k)) for k in ("path", "num_workers", "read_ahead")},
            "seconds": round(sum(e["seconds"] for e in per_epoch), 4), **usage.stop(),
            "peak_reset": usage.main_peak_reset}
