"""Fields staged by pack workers for writers that store them at the end (mmap, hdf5) or per task (lmdb).

Each task's worker appends every kept record's field bytes, in schema order,
to ``fieldparts/part-NNNNNN.bin`` (lengths and checksums travel back in the
TaskResult); the driver reads them back in record order.  The folder is
removed before the manifest is written.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterator, List

from .records import Record


class FieldParts:
    def __init__(self, root: Path) -> None:
        self.dir = root / "fieldparts"

    def _part(self, task: int) -> Path:
        return self.dir / f"part-{task:06d}.bin"

    def tee(self, task: int, records: Iterator[Record]) -> Iterator[Record]:
        """``records``, with each one's fields appended to the task's part file on the way (in a worker)."""
        self.dir.mkdir(exist_ok=True)
        with open(self._part(task), "wb") as f:
            for rec in records:
                for data in rec.fields.values():
                    f.write(data)
                yield rec

    def read(self, result) -> Iterator[List[bytes]]:
        """Each kept record's field bytes (a list in schema order) of one finished task."""
        with open(self._part(result.task), "rb") as f:
            for lengths in result.field_lengths:
                yield [f.read(n) for n in lengths]

    def read_all(self, results) -> Iterator[List[bytes]]:
        for r in results:
            yield from self.read(r)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
