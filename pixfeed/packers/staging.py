"""Staging for the single-writer formats (lmdb, hdf5).

LMDB and HDF5 files take one writer, but decoding should still run in every
pack worker.  So workers write exactly as the mmap format does: pixels into
their own rows of a pre-sized ``images.npy``, in place; encoded bytes into one
part file per task (``parts/part-NNNNNN.bin``).  No decoded pixels go through
a pipe.  As tasks finish, the main process copies their staged records into
the one output file in task order, while the workers keep decoding (a task
that finishes early waits for the ones before it, so record numbers follow
the source order).  ``finish`` copies what is left, completes the output and
removes the staging files, so the finished dataset holds only the format's
own files.

The output is opened on the first copy, in the main process, after the pool
has forked its workers; it is never pickled, and ``abort`` closes it when the
pack fails.
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Dict, Iterator, List

import numpy as np

from ..source import Source
from .mmap import MmapWriter
from .records import PackOptions
from .writer import TaskResult


class StagingWriter(MmapWriter):
    """Base of a writer that copies the mmap-style staging files into one output.

    Subclasses implement ``open_output`` (return the handle), ``copy_task``
    (copy one task's records, numbered from ``first``) and ``complete_output``
    (write what needs every record); the handle's ``close`` ends the write.
    """
    default_store = "encoded"

    def __init__(self, root: Path, source: Source, opts: PackOptions) -> None:
        super().__init__(root, source, opts)
        self.output: Any = None                    # opened on the first copy
        self._waiting: Dict[int, TaskResult] = {}  # tasks done before an earlier one
        self._next_task = 0                        # the next task to copy
        self._next_record = 0                      # the number of its first record

    def __getstate__(self) -> dict:
        return {**self.__dict__, "output": None}

    def open_output(self) -> Any:
        raise NotImplementedError

    def copy_task(self, first: int, result: TaskResult) -> None:
        raise NotImplementedError

    def complete_output(self, kept: np.ndarray, results: List[TaskResult]) -> None:
        raise NotImplementedError

    def task_done(self, result: TaskResult) -> None:
        """Copy every task that is now next in task order."""
        self._waiting[result.task] = result
        while self._next_task in self._waiting:
            result = self._waiting.pop(self._next_task)
            if self.output is None:
                self.output = self.open_output()
            self.copy_task(self._next_record, result)
            self._next_task += 1
            self._next_record += len(result.kept)

    def finish(self, kept: np.ndarray, results: List[TaskResult]) -> dict:
        for r in results[self._next_task:]:  # those task_done has not copied
            self.task_done(r)
        self.complete_output(kept, results)
        self.output.close()
        self.output = None
        self._remove_staging()
        return {}

    def abort(self) -> None:
        if self.output is not None:
            with contextlib.suppress(Exception):  # the pack's own error is the one to report
                self.output.close()
            self.output = None

    def staged_pixels(self) -> np.ndarray:
        """The staged N_source x H x W x 3 pixels (rows of skipped images are zero)."""
        return np.load(self._images, mmap_mode="r")

    def staged_records(self, result: TaskResult) -> Iterator:
        """Stored records (pixel rows or encoded bytes) of one finished task, in order."""
        if self.opts.store == "pixels":
            images = self.staged_pixels()
            return (images[i] for i in result.kept)
        return self._staged_part(result)

    def _staged_part(self, result: TaskResult) -> Iterator[bytes]:
        with open(self._part(result.task), "rb") as f:
            for length in result.extra:
                yield f.read(length)

    def _remove_staging(self) -> None:
        if self.opts.store == "pixels":
            self._images.unlink()
        else:
            shutil.rmtree(self.root / "parts")
