"""The stall profiler's verdict: input-bound or compute-bound, and what dominates.

* stall fraction = wait / (wait + transfer + compute), summed over batches;
  at ``INPUT_BOUND`` (10%) or more the loop is input-bound: faster data
  would make training faster.
* the dominant stage is the largest per-batch time among transfer and the
  wait split into read / decode / transform / collate / other by the shares
  that ``stages.sample_stages`` measured (just "wait" when it was not run).
  Where the GPU decoder counted work during the measured steps, "gpu decode"
  is its own stage: the decoder's seconds per batch, up to the wait (a decode
  that overlapped the step kept no one waiting), and the rest of the wait is
  split as above.
* a copy to the device above ``SLOW_COPY`` (10 ms) per batch is flagged with
  the pinned-memory advice whatever the verdict.
* the advice for each stage comes from ``advice.py``, given what the loader
  already uses (``InUse``), so it never recommends what is already on.
* no measured batch, no verdict: ``bound`` is "unmeasured" and the report says
  there was nothing to measure.
* no step (``no_step``: ``pixfeed profile`` without ``--step-ms``): a loop that
  does nothing but fetch waits for data all the time by definition, so the
  stall fraction says nothing; ``bound`` is "loader only" and the verdict gives
  what it does measure: the loader's own rate, and the step time per batch from
  which training would not wait for it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from pixfeed.console.texttable import table
from pixfeed.diagnose.advice import InUse, for_copy, for_stage
from pixfeed.diagnose.stages import GPU_STAGE
from pixfeed.console.words import plural

INPUT_BOUND = 0.10
SLOW_COPY = 0.010
UNMEASURED = "unmeasured"
LOADER_ONLY = "loader only"


@dataclass
class Step:
    wait: float = 0.0
    transfer: float = 0.0
    compute: float = 0.0
    images: int = 0
    gpu_decode: float = 0.0  # seconds the GPU decoder counted during this step (stages.gpu_stats)
    gpu_decoded: int = 0     # images it decoded on the GPU
    cpu_fallback: int = 0    # images it handed to the CPU decoder


@dataclass
class StallReport:
    steps: List[Step]
    stages: Dict[str, float] = field(default_factory=dict)
    in_use: InUse = field(default_factory=InUse)
    epochs: Optional[int] = None  # epochs the measured batches came from, when known
    no_step: bool = False         # the loop ran no step: the stall fraction is 100% by construction

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
        if not self.steps:
            return UNMEASURED
        if self.no_step:
            return LOADER_ONLY
        return "input-bound" if self.stall_fraction >= INPUT_BOUND else "compute-bound"

    @property
    def gpu_measured(self) -> bool:
        """Whether the GPU decoder counted any work in the measured steps."""
        return any(s.gpu_decode or s.gpu_decoded or s.cpu_fallback for s in self.steps)

    def per_batch(self) -> Dict[str, float]:
        """Seconds per batch: the GPU decode (when measured, up to the wait), the rest of the wait split by stage
        shares, then transfer and compute."""
        n = max(1, len(self.steps))
        wait, staged = self.total("wait") / n, sum(self.stages.values())
        gpu = min(self.total("gpu_decode") / n, wait) if self.gpu_measured else 0.0
        rest = wait - gpu
        split = {k: rest * v / staged for k, v in self.stages.items()} if staged else {"wait": rest}
        if self.gpu_measured:
            split = {GPU_STAGE: gpu, **split}
        return {**split, "transfer": self.total("transfer") / n, "compute": self.total("compute") / n}

    def gpu(self) -> Dict[str, float]:
        """What the GPU decoder counted over the measured steps: images, CPU fallbacks, seconds per batch."""
        n = max(1, len(self.steps))
        return {"gpu_decoded": self.total("gpu_decoded"), "cpu_fallback": self.total("cpu_fallback"),
                "seconds_per_batch": self.total("gpu_decode") / n}

    @property
    def dominant(self) -> str:
        times = self.per_batch()
        times.pop("compute")
        return max(times, key=times.__getitem__)

    def advice(self) -> List[str]:
        if not self.steps:
            return []
        transfer_ms = self.per_batch()["transfer"] * 1000
        if self.bound == LOADER_ONLY:
            notes = [f"if training waits for data, {for_stage(self.dominant, self.in_use)}"]
        elif self.bound == "compute-bound":
            notes = ["compute-bound: faster data will not speed this loop up; the step is the place to work"]
        elif self.dominant == "transfer":
            return [for_copy(transfer_ms, self.in_use)]
        else:
            notes = [for_stage(self.dominant, self.in_use)]
        if transfer_ms > SLOW_COPY * 1000:
            notes.append(for_copy(transfer_ms, self.in_use))
        return notes

    @property
    def verdict(self) -> str:
        if not self.steps:
            return "no verdict: no batch was measured (the loader gave none after the warm-up)"
        over = "" if self.epochs is None else f" over {plural(self.epochs, 'epoch')}"
        if self.no_step:
            n = max(1, len(self.steps))
            batch_ms = 1000 * (self.total("wait") + self.total("transfer")) / n
            return (f"{LOADER_ONLY}: the loader alone delivers {self.images_per_s:.0f} images/s, a batch every "
                    f"{batch_ms:.1f} ms, in {plural(len(self.steps), 'measured batch', 'measured batches')}{over}; "
                    f"a training step of {batch_ms:.1f} ms or more per batch would not wait for it, if the step "
                    "leaves the loader its CPUs (a GPU step); no step was run, so the loop waited for data all the "
                    "time by construction: --step-ms MS, your step's time, says whether training would wait; "
                    f"{self.dominant} dominates the data side")
        return (f"{self.bound}: waiting for data {self.stall_fraction:.0%} of the time, "
                f"{self.images_per_s:.0f} images/s in {plural(len(self.steps), 'measured batch', 'measured batches')}"
                f"{over}; "
                f"{self.dominant} dominates the data side")

    def to_dict(self) -> Dict[str, Any]:
        return {"steps": len(self.steps), "epochs": self.epochs, "images": self.total("images"), "wall_s": self.wall_s,
                "stall_fraction": self.stall_fraction, "images_per_s": self.images_per_s, "bound": self.bound,
                "dominant": self.dominant if self.steps else None, "in_use": asdict(self.in_use),
                "ms_per_batch": {k: v * 1000 for k, v in self.per_batch().items()},
                "stage_ms_sampled": {k: v * 1000 for k, v in self.stages.items()}, "advice": self.advice(),
                **({"gpu_decode": self.gpu()} if self.gpu_measured else {})}

    def __str__(self) -> str:
        rows = [[f"wait: {part}" if part in self.stages or part == GPU_STAGE else part, f"{seconds * 1000:.2f}",
                 f"{self.stages[part] * 1000:.2f}" if part in self.stages else ""]
                for part, seconds in self.per_batch().items()]
        head = ("per batch", "ms in loop", "ms sampled in process")
        if not self.steps:
            return self.verdict
        counted = self.gpu()
        gpu = ([f"GPU decode: {counted['gpu_decoded']} images on the GPU, {counted['cpu_fallback']} fell back to "
                f"the CPU, {counted['seconds_per_batch'] * 1000:.2f} ms of decode per batch"]
               if self.gpu_measured else [])
        return "\n".join([self.verdict, *table(head, rows), *gpu, *(f"-> {a}" for a in self.advice())])
