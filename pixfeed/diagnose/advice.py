"""Advice that holds for this loader on this machine: no rule recommends what is already in use.

``InUse.of(loader)`` collects what the loader already has: how the dataset
stores its images (pixels, encoded, packed with ``--max-side``), which decode
path runs (simplejpeg installed, ``exact``), the workers against the usable
CPUs, pinned memory and the batch path.  Each rule below offers a remedy only
when its condition holds:

* more workers: the dataset does CPU work per sample, there are fewer
  workers than usable CPUs (stored pixels are read in process on purpose)
  and the count was not measured already (``num_workers="tune"``);
* a pixels-mode pack: the records are not stored pixels already;
* ``--max-side``: the records are encoded and were not packed with it;
* ``pip install 'pixfeed[fast]'``: encoded records and simplejpeg missing;
  ``exact=False``: simplejpeg installed but the dataset asks for Pillow's path;
* whole-batch reads: fixed-size images that are not on the batch path yet;
* ``pin_memory=True``: the loader does not pin yet.
* faster storage: unless every page of the dataset's files is in the page
  cache already (``cached``, measured by ``mincore`` when the report is built):
  then a read is a copy and a checksum, CPU work, and the summary says so.
* the 'gpu decode' line of ``pixfeed doctor``: when decoding on the GPU dominates
  (after ``--max-side`` and stored pixels).

When no remedy is left the advice says so, with what is in use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from pixfeed.image import jpeghead as _jpeghead


@dataclass(frozen=True)
class InUse:
    store: Optional[str] = None       # "pixels" / "encoded"; None: not a pixfeed dataset
    max_side: Optional[int] = None    # the pack's --max-side
    exact: bool = False               # encoded records decoded by Pillow's exact path
    fast_decode: bool = True          # simplejpeg importable here
    cpu_bound: bool = True            # per-sample CPU work (False: stored pixels, a bare copy)
    workers: int = 0
    cpus: int = 0                     # usable CPUs; 0: unknown
    pin_memory: bool = False
    batch_path: bool = False          # make_loader reads whole batches (get_batch)
    tuned: bool = False               # num_workers="tune" measured the worker count
    cached: Optional[float] = None    # share of the dataset's file pages in the page cache; None: unknown

    @classmethod
    def of(cls, loader: Any) -> "InUse":
        from pixfeed.loaders.batch import BatchReader
        from pixfeed.machine.cpus import available_cpus

        dataset = getattr(loader, "dataset", None)
        batch_path = isinstance(dataset, BatchReader)
        dataset = dataset.dataset if batch_path else dataset
        plan = getattr(loader, "pixfeed_plan", None)
        manifest = getattr(dataset, "manifest", None) or {}
        return cls(store=manifest.get("store"), max_side=(manifest.get("options") or {}).get("max_side"),
                   cached=_cached(dataset, manifest),
                   exact=bool(getattr(dataset, "exact", False)), fast_decode=_jpeghead.simplejpeg is not None,
                   cpu_bound=getattr(dataset, "cpu_bound", True),
                   workers=getattr(loader, "num_workers", 0), cpus=plan.cpus if plan else available_cpus(),
                   pin_memory=bool(getattr(loader, "pin_memory", False)), batch_path=batch_path,
                   tuned=getattr(loader, "pixfeed_tuning", None) is not None)

    def summary(self) -> str:
        """What is in use, in words: '2 workers on 2 usable CPUs, encoded records, fast decode (simplejpeg)'."""
        parts = []
        if self.cpus:
            parts.append(f"{self.workers} worker{'s' * (self.workers != 1)} on {self.cpus} usable "
                         f"CPU{'s' * (self.cpus != 1)}" if self.workers else "reads in the training process")
            parts[-1] += " (autotuned)" if self.tuned else ""
        if self.store:
            parts.append(f"{self.store} records" + (f" packed with --max-side {self.max_side}" if self.max_side else ""))
        if self.store == "encoded":
            parts.append("Pillow's exact decode" if self.exact or not self.fast_decode else "fast decode (simplejpeg)")
        if self.pin_memory:
            parts.append("pinned memory")
        if self.in_page_cache:
            parts.append("every page of the dataset in the page cache (reads are copies and checksums, CPU work)")
        return ", ".join(parts)

    @property
    def in_page_cache(self) -> bool:
        return self.cached is not None and self.cached >= CACHED


CACHED = 0.99  # share of the pages resident from which storage is not what reads wait on


def _cached(dataset: Any, manifest: dict) -> Optional[float]:
    """The share of a local dataset's files resident in the page cache (pixfeed.storage.pagecache), or None."""
    from pathlib import Path

    from pixfeed.storage.pagecache import resident_fraction

    path = getattr(dataset, "path", None)
    if not isinstance(path, Path) or not manifest.get("files"):
        return None
    return resident_fraction([path / name for name in manifest["files"]], windows=64)


Rule = Callable[[InUse], Optional[str]]


def more_workers(u: InUse) -> Optional[str]:
    if not u.cpu_bound or u.workers >= u.cpus or u.tuned:
        return None
    return f"more workers ({u.workers} of {u.cpus} usable CPUs now; num_workers='tune' measures)"


def pixels_pack(u: InUse) -> Optional[str]:
    return None if u.store == "pixels" else "pack with --store pixels at the training size (reads skip decoding)"


def max_side(u: InUse) -> Optional[str]:
    if u.store != "encoded" or u.max_side:
        return None
    return "pack with --max-side 384 (smaller JPEGs to read and decode, for 224-pixel training)"


def fast_decode(u: InUse) -> Optional[str]:
    if u.store != "encoded":
        return None
    if not u.fast_decode:
        return "pip install 'pixfeed[fast]' (simplejpeg: JPEG decode by libjpeg-turbo)"
    return "open the dataset with exact=False (the fast decode path; simplejpeg is installed)" if u.exact else None


def batch_reads(u: InUse) -> Optional[str]:
    return None if u.batch_path else "give every image one size (size=) so make_loader reads whole batches"


def faster_storage(u: InUse) -> Optional[str]:
    return None if u.in_page_cache else "faster storage (see 'pixfeed doctor PATH'), or the dataset in RAM"


def gpu_transform(u: InUse) -> Optional[str]:
    return "move augmentation to the GPU, after the copy"


def own_code(u: InUse) -> Optional[str]:
    return "profile the dataset's __getitem__"


def gpu_codec(u: InUse) -> Optional[str]:
    return "check the 'gpu decode' line of 'pixfeed doctor' (nvImageCodec and nvJPEG built for torch's CUDA)"


STAGE_RULES = {
    "read": ("reading dominates", (faster_storage, max_side, more_workers)),
    "decode": ("decoding dominates", (pixels_pack, max_side, fast_decode, more_workers)),
    "transform": ("the transform dominates", (gpu_transform, more_workers)),
    "collate": ("collate dominates", (batch_reads, more_workers)),
    "other": ("the dataset's own code dominates", (own_code, more_workers)),
    "gpu decode": ("decoding on the GPU dominates", (max_side, pixels_pack, gpu_codec)),
    "wait": ("the loop waits for data", (more_workers, pixels_pack, max_side, fast_decode)),
}


def remedies(rules: tuple, u: InUse) -> List[str]:
    return [text for text in (rule(u) for rule in rules) if text]


def for_stage(stage: str, u: InUse) -> str:
    """One line: what dominates, the remedies that apply here, and what is already in use."""
    head, rules = STAGE_RULES[stage]
    found = remedies(rules, u)
    in_use = u.summary()
    if not found:
        return f"{head}, and the remedies are in use ({in_use}): more CPUs would help"
    return f"{head}: {'; or '.join(found)}" + (f" (in use: {in_use})" if in_use else "")


def for_copy(ms: float, u: InUse) -> str:
    """The slow-copy line: pin if not pinned, else overlap."""
    if u.pin_memory:
        return (f"copy to the device takes {ms:.0f} ms per batch from pinned memory: overlap it with compute "
                "(pixfeed.DevicePrefetcher, non_blocking copies)")
    return (f"copy to the device takes {ms:.0f} ms per batch: use pin_memory=True and non_blocking copies, "
            "and overlap them with compute (make_loader pins on CUDA; pixfeed.DevicePrefetcher overlaps)")
