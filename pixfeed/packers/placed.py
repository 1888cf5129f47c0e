"""A data file written once: each pack task's records placed ahead, in a region of their own.

``begin`` sizes the file from the source's sizes, task by task (exact for
files stored as they are and for a repack of mmap or wds; upper bounds for a
repack of LMDB or HDF5; estimates elsewhere), its blocks reserved
(``_files.reserve``) unless records are re-encoded smaller.  Each task
writes its records one after another from its region's start, and the
records that do not fit go to the task's part file (``_files.write_placed``).

As results reach the driver, in whatever order, a thread of the driver hashes
the file's finished prefix (``checksum.FileHasher``: the manifest's file hash
and chunk hashes) while later tasks still write, so a pack whose every task
filled its region exactly does not read the file again.  Otherwise ``join``
closes the gaps that skipped or smaller records left (moving regions down in
place) or, when any part file exists, joins regions and parts in task order
into a new file, which the manifest then hashes as any other file.
"""
from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, List, Optional

import numpy as np

from ..checksum import FileHasher
from ..storage.chunkcache import CHUNK_BYTES
from . import _files
from ._files import copy_range, write_placed
from .records import Record
from .writer import TaskResult


class PlacedFile:
    def __init__(self, path: Path) -> None:
        self.path, self.parts = path, path.parent / "parts"
        self.regions: List[int] = []
        self._driver()

    def _driver(self) -> None:
        """The driver's hashing state (not sent to workers or Ray tasks)."""
        self._done: dict = {}
        self._next, self._hasher, self._pool = 0, FileHasher(CHUNK_BYTES), None

    def __getstate__(self) -> dict:
        return {"path": self.path, "parts": self.parts, "regions": self.regions}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._driver()

    def begin(self, sizes: np.ndarray, tasks: List[np.ndarray], reserve: bool = True) -> None:
        """Place the tasks' regions from ``sizes``; ``reserve`` their blocks where the sizes are the
        bytes to come (not the source's, far above, of records re-encoded smaller)."""
        self.parts.mkdir()
        sizes = np.maximum(sizes, 0)
        self.regions = np.concatenate([[0], np.cumsum([int(sizes[t].sum()) for t in tasks])]).tolist()
        with open(self.path, "wb") as f:
            f.truncate(self.regions[-1])
            if reserve:
                _files.reserve(f.fileno(), self.regions[-1], self.path)

    def write(self, task: int, records: Iterable[Record]) -> tuple:
        """(the records' lengths, bytes written in the region) of task ``task`` (in a worker)."""
        return write_placed(self.path, self.regions[task], self.regions[task + 1], self._part(task), records)

    def task_done(self, result: TaskResult) -> None:
        """Hash the regions now finished in order, on the driver's thread, while tasks still run."""
        self._done[result.task] = result
        while self._next in self._done and self._filled(self._done[self._next]):
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="pixfeed-hash")
            self._pool.submit(self._feed, self.regions[self._next], self.regions[self._next + 1])
            self._next += 1

    def _feed(self, start: int, stop: int) -> None:
        """Hash a finished region, the file opened after its task closed it (what a shared file system
        such as NFS promises to show another machine's writes by)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self._hasher.feed(fd, start, stop)
        finally:
            os.close(fd)

    def join(self, results: List[TaskResult]) -> Optional[tuple]:
        """Make the file the records in task order; return (file hash, chunk hashes) when the file
        was hashed while tasks ran, else None."""
        hashed = self._finish_hashing() if self._next == len(self.regions) - 1 else None
        self.abort()
        if hashed is None:
            self._rewrite(results)
        shutil.rmtree(self.parts)
        return hashed

    def abort(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def _finish_hashing(self) -> tuple:
        if self._pool is not None:
            self._pool.submit(lambda: None).result()  # the queued regions hashed (raises what they raised)
        return self._hasher.result()

    def _filled(self, result: TaskResult) -> bool:
        lengths, placed = result.extra
        return sum(lengths) == placed == self.regions[result.task + 1] - self.regions[result.task]

    def _part(self, task: int) -> Path:
        return self.parts / f"part-{task:06d}.bin"

    def _rewrite(self, results: List[TaskResult]) -> None:
        placed = [(self.regions[r.task], r.extra[1]) for r in results]
        if all(sum(r.extra[0]) == r.extra[1] for r in results):  # every record in its region: close the gaps
            with open(self.path, "r+b") as f:
                cursor = 0
                for start, count in placed:
                    if start != cursor:
                        copy_range(f, start, f, cursor, count)
                    cursor += count
                f.truncate(cursor)
            return
        joined, end = self.path.with_name(self.path.name + ".joined"), 0
        with open(self.path, "rb") as old, open(joined, "wb") as out:
            for (start, count), r in zip(placed, results):
                end += copy_range(old, start, out, end, count)
                if self._part(r.task).exists():
                    with open(self._part(r.task), "rb") as part:
                        end += copy_range(part, 0, out, end, os.fstat(part.fileno()).st_size)
        joined.replace(self.path)
