"""The stall profiler's verdict: input-bound or compute-bound, and what dominates.

* stall fraction = wait / (wait + transfer + compute), summed over batches;
  at ``INPUT_BOUND`` (10%) or more the loop is input-bound: faster data
  would make training faster.
* the dominant stage is the largest per-batch time among transfer and the
  wait split into read / decode / transform / collate / other by the shares
  that ``stages.sample_stages`` measured (just "wait" when it was not run).
* a copy to the device above ``SLOW_COPY`` (10 ms) per batch is flagged with
  the pinned-memory advice whatever the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from pixfeed.texttable import table

INPUT_BOUND = 0.10
SLOW_COPY = 0.010
PINNED = ("copy to the device takes {ms:.0f} ms per batch: use pin_memory=True and non_blocking copies, "
          "and overlap them with compute (make_loader pins on CUDA; pixfeed.DevicePrefetcher overlaps)")
ADVICE = {
    "read": "reading dominates: faster storage (see 'pixfeed doctor PATH'), a pixels-mode pack, or more workers",
    "decode": "decoding dominates: pack in pixels mode at the training size, install pixfeed[fast], or more workers",
    "transform": "the transform dominates: move augmentation to the GPU after the copy, or more workers",
    "collate": "collate dominates: fixed-size images let make_loader read whole batches without stacking samples",
    "other": "the dataset's own code dominates: profile its __getitem__, or use more workers",
    "wait": "the loop waits for data: more workers (num_workers='tune' measures how many) or a faster format",
}


@dataclass
class Step:
    wait: float = 0.0
    transfer: float = 0.0
    compute: float = 0.0
    images: int = 0


@dataclass
class StallReport:
    steps: List[Step]
    stages: Dict[str, float] = field(default_factory=dict)

    def total(self, part: str) -> float:
        return sum(getattr(s, part) for s in self.steps)

    @property
    def wall_s(self) -> float:
        return self.total("wait") + self.total("transfer") + self.total("compute")

    @property
    def stall_fraction(self) -> float:
        return self.total("wait") / self.wall_s if self.wall_s else 0.0

    @property
    def images_per_s(self) -> float:
        return self.total("images") / self.wall_s if self.wall_s else 0.0

    @property
    def bound(self) -> str:
        return "input-bound" if self.stall_fraction >= INPUT_BOUND else "compute-bound"

    def per_batch(self) -> Dict[str, float]:
        """Seconds per batch: the wait split by stage shares, then transfer and compute."""
        n = max(1, len(self.steps))
        wait, staged = self.total("wait") / n, sum(self.stages.values())
        split = {k: wait * v / staged for k, v in self.stages.items()} if staged else {"wait": wait}
        return {**split, "transfer": self.total("transfer") / n, "compute": self.total("compute") / n}

    @property
    def dominant(self) -> str:
        times = self.per_batch()
        times.pop("compute")
        return max(times, key=times.__getitem__)

    def advice(self) -> List[str]:
        notes = []
        if self.bound == "input-bound":
            notes.append(ADVICE.get(self.dominant, PINNED.format(ms=self.per_batch()["transfer"] * 1000)))
        else:
            notes.append("compute-bound: faster data will not speed this loop up; the step is the place to work")
        transfer = self.per_batch()["transfer"]
        if transfer > SLOW_COPY and self.dominant != "transfer":
            notes.append(PINNED.format(ms=transfer * 1000))
        return notes

    @property
    def verdict(self) -> str:
        return (f"{self.bound}: waiting for data {self.stall_fraction:.0%} of the time, "
                f"{self.images_per_s:.0f} images/s; {self.dominant} dominates the data side")

    def to_dict(self) -> Dict[str, Any]:
        return {"steps": len(self.steps), "images": self.total("images"), "wall_s": self.wall_s,
                "stall_fraction": self.stall_fraction, "images_per_s": self.images_per_s, "bound": self.bound,
                "dominant": self.dominant, "ms_per_batch": {k: v * 1000 for k, v in self.per_batch().items()},
                "stage_ms_sampled": {k: v * 1000 for k, v in self.stages.items()}, "advice": self.advice()}

    def __str__(self) -> str:
        rows = [[f"wait: {part}" if part in self.stages else part, f"{seconds * 1000:.2f}",
                 f"{self.stages[part] * 1000:.2f}" if part in self.stages else ""]
                for part, seconds in self.per_batch().items()]
        head = ("per batch", "ms in loop", "ms sampled in process")
        return "\n".join([self.verdict, *table(head, rows), *(f"-> {a}" for a in self.advice())])
