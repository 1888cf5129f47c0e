"""The writer hooks a format implements, and what a task reports back."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List

import numpy as np

from ..sources.folder import Source
from .options import PackOptions
from .records import Record

TASKS_PER_WORKER = 4
TASK_FILES = 4096
TASK_BYTES = 512 << 20


@dataclass
class TaskResult:
    task: int
    kept: List[int] = field(default_factory=list)
    checksums: List[int] = field(default_factory=list)
    stored_bytes: int = 0
    skipped: List[dict] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    extra: object = None
    field_lengths: List[List[int]] = field(default_factory=list)    # per kept record, per schema field
    field_checksums: List[List[int]] = field(default_factory=list)  # xxh3_64 of those stored bytes
    upscaled: int = 0          # pixels: images enlarged to the stored size (sizes.scale > 1)
    upscale_max: float = 0.0   # the most a side of one of them was enlarged


class Writer:
    """A format's writer.  Subclasses implement the hooks; ``pack`` runs them.

    ``begin``, ``task_done``, ``finish`` and ``abort`` run in the main process;
    ``write_task`` runs in a worker, consumes the task's records and writes the
    task's own output.  Fields (``Record.fields``) are staged for the writer in
    part files (``fieldparts``), unless it writes them itself (``own_fields``).
    """
    own_fields = False
    needs_shape = True  # records carry their image's (H, W) (records.load_record)

    def __init__(self, root: Path, source: Source, opts: PackOptions):
        self.root, self.source, self.opts = root, source, opts
        self.hashed: dict = {}  # {file: (xxh3_64, chunk hashes)} hashed by the writer, not read again

    def plan(self, workers: int) -> List[np.ndarray]:
        """Contiguous slices of the source: at least ``TASKS_PER_WORKER`` per worker (fewer
        only when there are fewer images), each at most about ``TASK_FILES`` images and
        ``TASK_BYTES`` source bytes (so ImageNet's 1.28M files give ~570 tasks)."""
        n, sizes = len(self.source), self.source.sizes
        cost = np.cumsum(1 / TASK_FILES + sizes / TASK_BYTES)  # a task's worth is 1
        ntasks = min(n, max(workers * TASKS_PER_WORKER, int(np.ceil(cost[-1]))))
        ends = np.searchsorted(cost, cost[-1] * np.arange(1, ntasks) / ntasks, side="right")
        return [t for t in np.split(np.arange(n), ends) if len(t)]

    def begin(self, tasks: List[np.ndarray]) -> None:
        pass

    def write_task(self, task: int, indices: np.ndarray, records: Iterator[Record]) -> object:
        raise NotImplementedError

    def task_done(self, result: TaskResult) -> None:
        """Called as each task's result arrives (in completion order) while other
        tasks may still run; a pool's workers are forked before the first call."""

    def finished(self, result: TaskResult) -> List[str]:
        """Files (relative to the output folder) complete once ``result``'s task is done;
        a bucket DST uploads them while later tasks run.  Default: none before ``finish``."""
        return []

    def finish(self, kept: np.ndarray, results: List[TaskResult]) -> dict:
        """Write the remaining files; return extra manifest fields."""
        raise NotImplementedError

    def abort(self) -> None:
        """Release what the writer holds open when the pack fails; must not raise."""
