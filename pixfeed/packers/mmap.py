"""Writer of the memory-mapped format (layout: ``pixfeed.layouts.mmap``).

Pixels: ``begin`` sizes images.npy for every source image and each worker
writes its rows in place (``--on-error skip`` compacts it at the end).
Encoded: data.bin is a ``PlacedFile``: each task writes its records in a
region placed ahead from the source's sizes, so data.bin is written once
(and, when every record fits, hashed while tasks run, never read again).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, List

import numpy as np

from ..layouts import mmap as layout
from ..fields import codec
from ._files import allocate_rows, write_rows
from .fieldparts import FieldParts
from .placed import PlacedFile
from .records import Record
from .writer import TaskResult, Writer

_COPY_ROWS = 1024


class MmapWriter(Writer):
    needs_shape = False  # data.bin holds the files' bytes only

    @property
    def _images(self) -> Path:
        return self.root / layout.IMAGES

    def begin(self, tasks: List[np.ndarray]) -> None:
        if self.opts.store == "pixels":
            allocate_rows(self._images, len(self.source), self.opts.size)
        else:
            self.placed = PlacedFile(self.root / layout.DATA)
            self.placed.begin(self.source.sizes, tasks, reserve=not self.opts.max_side)

    def write_task(self, task: int, indices: np.ndarray, records: Iterator[Record]) -> object:
        if self.opts.store == "pixels":
            write_rows(self._images, records)
            return []
        return self.placed.write(task, records)

    def task_done(self, result: TaskResult) -> None:
        if self.opts.store == "encoded":
            self.placed.task_done(result)

    def abort(self) -> None:
        if self.opts.store == "encoded" and hasattr(self, "placed"):
            self.placed.abort()

    def finish(self, kept: np.ndarray, results: List[TaskResult]) -> dict:
        if self.opts.store == "pixels":
            if len(kept) < len(self.source):
                self._compact(kept)
        else:
            lengths = np.array([n for r in results for n in r.extra[0]], dtype=np.int64)
            np.save(self.root / layout.OFFSETS, np.concatenate([[0], np.cumsum(lengths)]).astype(layout.OFFSET_DTYPE))
            hashed = self.placed.join(results)
            if hashed is not None:
                self.hashed[layout.DATA] = hashed
        labels = self.source.labels[kept]
        np.save(self.root / layout.LABELS, labels.astype(layout.LABEL_DTYPE))
        checksums = np.array([c for r in results for c in r.checksums], dtype=layout.CHECKSUM_DTYPE)
        np.save(self.root / layout.CHECKSUMS, checksums)
        if self.source.schema:
            self._write_fields(results)
        return {}

    def _write_fields(self, results: List[TaskResult]) -> None:
        """fields/: one .npy of fixed-shape values, or .bin + offsets, and checksums per field; one pass."""
        (self.root / layout.FIELDS).mkdir()
        n, path = sum(len(r.field_lengths) for r in results), lambda *a: self.root / layout.field_file(*a)
        rows = [codec.fixed_row(f, self.opts.store, self.opts.size) for f in self.source.schema]
        outs = [np.lib.format.open_memmap(path(f.name, "npy"), "w+", row[0], (n, *row[1]))
                if row else open(path(f.name, "bin"), "wb") for f, row in zip(self.source.schema, rows)]
        for k, values in enumerate(FieldParts(self.root).read_all(results)):
            for out, row, data in zip(outs, rows, values):
                if row:
                    out[k] = np.frombuffer(data, row[0]).reshape(row[1])
                else:
                    out.write(data)
        for j, (f, out, row) in enumerate(zip(self.source.schema, outs, rows)):
            if row:
                out.flush()
            else:
                out.close()
                lengths = [lens[j] for r in results for lens in r.field_lengths]
                np.save(path(f.name, "offsets"), np.concatenate([[0], np.cumsum(lengths)]).astype(layout.OFFSET_DTYPE))
            sums = [c[j] for r in results for c in r.field_checksums]
            np.save(path(f.name, "checksums"), np.array(sums, dtype=layout.CHECKSUM_DTYPE))
        del outs

    def _compact(self, kept: np.ndarray) -> None:
        """Drop the rows of skipped images (rare: only with --on-error skip)."""
        old = np.load(self._images, mmap_mode="r")
        tmp = self.root / "images.compact.npy"
        allocate_rows(tmp, len(kept), old.shape[1:3])
        new = np.load(tmp, mmap_mode="r+")
        for start in range(0, len(kept), _COPY_ROWS):
            new[start:start + _COPY_ROWS] = old[kept[start:start + _COPY_ROWS]]
        new.flush()
        del old, new
        tmp.replace(self._images)
