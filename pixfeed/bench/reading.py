"""Reading through a DataLoader into a loop that only touches each batch.

``FolderDataset`` under ``plain_loader`` is the baseline a user has today: a
torchvision-ImageFolder-style dataset over the source files (PIL open,
convert to RGB, then torchvision's Resize(256) + CenterCrop(224) for size 224
with ``crop="center"``, or RandomResizedCrop(224) + RandomHorizontalFlip with
``crop="random"``), written out here so the benchmark needs no torchvision,
under ``DataLoader(num_workers=4, pin_memory=False)``.
"""
from __future__ import annotations

import gc
import time
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image

from ..image.decode import CROP_RATIO, Size, random_resized_crop, resize
from ..sources.folder import Source
from .ceilings import bracket
from .procstats import ProcUsage

MIN_READ_S = 1.0  # read at least this long per row (over at least --epochs epochs)
MAX_EPOCHS = 20


class FolderDataset(torch.utils.data.Dataset):
    """ImageFolder-style: ``(uint8 CHW RGB tensor, label)`` straight from the image files."""

    def __init__(self, source: Source, size: Size, crop: str = "center") -> None:
        self.files = [source.root / p for p in source.paths]
        self.labels = source.labels.tolist()
        self.size, self.crop = size, crop

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as img:
            if self.crop == "random":  # a generator per sample from torch's RNG, as a worker seeds it
                rng = np.random.default_rng(int(torch.randint(2**62, ())))
                img = random_resized_crop(img.convert("RGB"), self.size, rng)
            else:
                img = resize(img.convert("RGB"), self.size, "crop", CROP_RATIO)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), self.labels[i]


def plain_loader(dataset: torch.utils.data.Dataset, batch_size: int) -> torch.utils.data.DataLoader:
    """The DataLoader a user writes today."""
    return torch.utils.data.DataLoader(dataset, batch_size, shuffle=True, num_workers=4, pin_memory=False)


def _epoch(loader, usage: ProcUsage) -> dict:
    """Read one epoch; "steady" rates leave out the first batch (worker start-up, first reads)."""
    images = nbytes = 0
    first = None
    start = time.perf_counter()
    for batch, labels in loader:
        images += int(labels.numel())
        nbytes += batch.numel() * batch.element_size()
        batch[0, 0, 0, 0].item()  # touch: the loop a GPU step would run, minus the step
        first = first or (time.perf_counter() - start, images, nbytes)
        usage.sample(force=images == first[1])
    seconds = time.perf_counter() - start
    t0, n0, b0 = first if first and images > first[1] else (0.0, 0, 0)
    rest = max(seconds - t0, 1e-9)
    return {"seconds": round(seconds, 4), "images": images, "bytes": nbytes,
            "first_batch_s": round(first[0] if first else seconds, 4),
            "images_per_s": round(images / seconds, 1), "mb_per_s": round(nbytes / seconds / 1e6, 1),
            "steady_images_per_s": round((images - n0) / rest, 1), "steady_mb_per_s": round((nbytes - b0) / rest / 1e6, 1)}


def read_directly(dataset, batch_size: int, epochs: int) -> dict:
    """The dataset's own reads in a plain loop, no DataLoader (what ``make_loader`` adds shows beside it):
    ``get_batch`` over shuffled batches where the dataset has one shape, else one read per sample, or the
    stream of an iterable dataset; the best epoch's images/s."""
    rates = []
    for epoch in range(max(1, epochs)):
        images, start = 0, time.perf_counter()
        if isinstance(dataset, torch.utils.data.IterableDataset):
            images = sum(1 for _ in dataset)
        else:
            order = np.random.default_rng(epoch).permutation(len(dataset))
            batched = getattr(dataset, "fixed_shape", None) is not None and callable(getattr(dataset, "get_batch", None))
            for first in range(0, len(order), batch_size):
                indices = order[first:first + batch_size].tolist()
                if batched:
                    dataset.get_batch(indices)
                else:
                    for i in indices:
                        dataset[i]
                images += len(indices)
        rates.append(images / max(time.perf_counter() - start, 1e-9))
    return {"images_per_s": round(max(rates), 1)}


def read_epochs(make: Callable[[], torch.utils.data.DataLoader], epochs: int,
                limit: Callable[[int], dict], before_epoch: Optional[Callable[[], None]] = None) -> dict:
    """Build a loader with ``make`` and read ``epochs`` epochs: per-epoch rates, peaks, CPU time.

    The headline ``images_per_s`` and ``mb_per_s`` are the best epoch's, first
    batch included (worker start-up and first reads are real costs of every
    epoch).  Each epoch also has its "steady" rates after the first batch; they
    overstate multi-worker loaders, whose workers fill several batches at once.
    ``limit(workers)`` measures the row's ceiling, before and after the epochs.
    Fast rows read more epochs, until ``MIN_READ_S`` of reading (at most
    ``MAX_EPOCHS``): a 25 ms epoch alone is at the mercy of one scheduler hiccup.
    """
    loader = make()
    before = limit(loader.num_workers)
    usage = ProcUsage().start()
    plan = getattr(loader, "pixfeed_plan", None)
    workers = loader.num_workers
    per_epoch: List[dict] = []
    while len(per_epoch) < epochs or (sum(e["seconds"] for e in per_epoch) < MIN_READ_S
                                      and len(per_epoch) < MAX_EPOCHS):
        if before_epoch is not None:
            before_epoch()
        per_epoch.append(_epoch(loader, usage))
    usage.mark()
    del loader
    if workers:
        gc.collect()  # shuts persistent workers down, so their CPU time is counted
    stats = usage.stop()  # before the second ceiling, whose processes must not count
    best = max(per_epoch, key=lambda e: e["images_per_s"])
    return {"ceiling": bracket(before, limit(workers)), "epochs": per_epoch,
            "images_per_s": best["images_per_s"], "mb_per_s": best["mb_per_s"],
            "first_batch_s": per_epoch[0]["first_batch_s"], "workers": workers,
            "plan": None if plan is None else {k: str(getattr(plan, k)) for k in ("path", "num_workers", "read_ahead")},
            "seconds": round(sum(e["seconds"] for e in per_epoch), 4), **stats,
            "peak_reset": usage.main_peak_reset}
