"""Staging for the single-writer formats (lmdb, hdf5).

LMDB and HDF5 files take one writer, but decoding should still run in every
pack worker.  So workers stage their records in files of their own (a
``Staging`` helper, composed into the writer): pixels into their own rows of a
pre-sized ``staging/pixels.npy``, in place (``rows``); anything else into one
part file per task (``staging/part-NNNNNN.bin``), each record as the writer's
``parts`` make it, so that the main process copies each once, from a map of
the file.  No decoded pixels go through a pipe.
As tasks finish, the main process copies their staged records into the one
output file in task order, while the workers keep decoding (a task that
finishes early waits for the ones before it, so record numbers follow the
source order).  ``finish`` copies what is left, completes the output and
removes the staging folder, so the finished dataset holds only the format's
own files.  Staging names are the helper's own: no format's layout depends on
another's.

The output is opened on the first copy, in the main process, after the pool
has forked its workers; it is never pickled, and ``abort`` closes it when the
pack fails.
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Sequence

import numpy as np

from ..sources.folder import Source
from ._files import allocate_rows, read_part, write_part, write_rows
from .options import PackOptions
from .records import Record
from .writer import TaskResult, Writer


class Staging:
    """A pack's staged records, under ``root/staging``, until the output holds them."""

    def __init__(self, root: Path, count: int, opts: PackOptions, rows: bool) -> None:
        self.dir, self.count, self.opts = root / "staging", count, opts
        self.rows = rows and opts.store == "pixels"

    @property
    def _pixels(self) -> Path:
        return self.dir / "pixels.npy"

    def _part(self, task: int) -> Path:
        return self.dir / f"part-{task:06d}.bin"

    def begin(self) -> None:
        self.dir.mkdir()
        if self.rows:
            allocate_rows(self._pixels, self.count, self.opts.size)

    def write_task(self, task: int, records: Iterator[Record], parts: Callable[[Record], Sequence]) -> List[int]:
        """Stage a task's records (in a worker), each as ``parts(record)`` unless staged as rows; return
        what ``records`` needs to read them back."""
        if self.rows:
            write_rows(self._pixels, records)
            return []
        return write_part(self._part(task), map(parts, records))

    def pixels(self) -> np.ndarray:
        """The staged N_source x H x W x 3 pixels (rows of skipped images are zero)."""
        return np.load(self._pixels, mmap_mode="r")

    def records(self, result: TaskResult) -> Iterator:
        """One finished task's staged records, in order: pixel rows, or views of its part file."""
        if self.rows:
            images = self.pixels()
            return (images[i] for i in result.kept)
        return read_part(self._part(result.task), result.extra)

    def remove(self) -> None:
        shutil.rmtree(self.dir)


class StagedWriter(Writer):
    """Base of a writer that stages records and copies them into one output.

    Subclasses implement ``open_output`` (return the handle), ``copy_task``
    (copy one task's records, from ``self.staging.records``, numbered from
    ``first``) and ``complete_output`` (write what needs every record); the
    handle's ``close`` ends the write; ``write_extents`` then reads the
    finished file for its records' byte ranges.  ``parts`` (in a worker) gives
    what is staged of a record, unless ``rows`` stages pixels in place.
    """
    rows = True

    def __init__(self, root: Path, source: Source, opts: PackOptions) -> None:
        super().__init__(root, source, opts)
        self.staging = Staging(root, len(source), opts, self.rows)
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

    def begin(self, tasks: List[np.ndarray]) -> None:
        self.staging.begin()

    def parts(self, rec: Record) -> Sequence:
        return [rec.data]

    def write_task(self, task: int, indices: np.ndarray, records: Iterator[Record]) -> List[int]:
        return self.staging.write_task(task, records, self.parts)

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
        self.write_extents(len(kept))
        self.staging.remove()
        return {}

    def write_extents(self, count: int) -> None:
        """Once the output file is closed and final: write where each of its ``count`` records lies in it
        (``storage.extentfile``), when the format has such a file."""

    def abort(self) -> None:
        if self.output is not None:
            with contextlib.suppress(Exception):  # the pack's own error is the one to report
                self.output.close()
            self.output = None
