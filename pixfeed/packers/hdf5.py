"""Writer of the HDF5 format (layout: ``pixfeed.layouts.hdf5``).

Workers decode and stage records (``pixfeed.packers.staging``), and the main
process copies each finished task into data.h5 in task order while the others
run: HDF5 has one writer, and a single file
(rather than per-task files joined by a virtual dataset) stays portable and
readable by any HDF5 tool.  ``images``/``encoded`` are created with a row per
source image and shrunk to N at the end when images were skipped.  Once
every record is in data.h5, its chunk index gives where each lies in it,
written as ``extents.npy`` once the file is closed (``write_extents``; none
for compressed pixels).
"""
from __future__ import annotations

import contextlib
import json
import os
from itertools import islice
from typing import Iterator, List

import h5py
import numpy as np

from .. import registry
from ..errors import OptionError
from ..fields import codec
from ..fields.array import stored_dtype
from ..datasets.hdf5 import every_extent
from ..layouts import hdf5 as layout
from ..storage import extentfile
from .fieldparts import FieldParts
from .staging import StagedWriter
from .writer import TaskResult

_ROWS = 256


class H5Writer(StagedWriter):
    """Stages records, then copies them into data.h5 (one writer) in task order."""
    needs_shape = False  # an encoded row is the file's bytes only
    _extents = None  # (starts, lengths) found by complete_output, written by write_extents once data.h5 is closed

    def begin(self, tasks: List[np.ndarray]) -> None:
        compression = self.opts.compression
        if compression is not None and compression not in layout.COMPRESSIONS:
            raise OptionError(f"--compression {compression!r}: expected {' or '.join(layout.COMPRESSIONS)}")
        self._held = []  # the datasets this pack writes, open until data.h5 closes (see abort)
        super().begin(tasks)

    def open_output(self) -> h5py.File:
        """data.h5 with a row for every source image; ``complete_output`` drops
        those of skipped images (never written, so never stored)."""
        f = h5py.File(self.root / layout.DATA, "w")
        try:
            self._create(f, len(self.source))
        except BaseException:
            f.close()
            raise
        self._held = [f[layout.IMAGES if self.opts.store == "pixels" else layout.ENCODED]]
        return f

    @property
    def _records(self):
        """The dataset of the records (pixels or encoded), the first of those held."""
        return self._held[0]

    def _create(self, f: h5py.File, n: int) -> None:
        if self.opts.store == "pixels":
            shape = (n, *self.opts.size, 3)
            f.create_dataset(layout.IMAGES, shape, np.uint8, maxshape=shape, chunks=(1, *shape[1:]),
                             compression=self.opts.compression)
        else:
            f.create_dataset(layout.ENCODED, (n,), h5py.vlen_dtype(np.uint8), maxshape=(n,))

    # On a full disk, closing an HDF5 dataset or file can fail (what HDF5 flushes cannot be written), and
    # HDF5 is then left with a dataset open without its file: freeing it, or HDF5's own exit handler, crashed
    # the process (a segfault in H5FO_top_decr, after the pack had reported the full disk).  So no dataset is
    # closed while the pack runs (those it writes are held in ``_held`` until the file closes), every change is
    # flushed before that close, and a failed pack, whose data.h5 is discarded, has what HDF5 still writes as it
    # closes go to /dev/null: that close cannot fail for want of space.
    def abort(self) -> None:
        if self.output is not None:
            with contextlib.suppress(Exception):
                null = os.open(os.devnull, os.O_RDWR)
                try:
                    os.dup2(null, self.output.id.get_vfd_handle())
                finally:
                    os.close(null)
        super().abort()
        self._held = []

    def copy_task(self, first: int, result: TaskResult) -> None:
        if self.opts.store == "pixels":
            self._copy_pixels(first, np.asarray(result.kept, dtype=np.int64))
        else:
            self._copy_encoded(first, result)

    def complete_output(self, kept: np.ndarray, results: List[TaskResult]) -> None:
        f = self.output
        self._records.resize(len(kept), axis=0)
        self._held += [f.create_dataset(layout.LABELS, data=self.source.labels[kept].astype("<i8")),
                       f.create_dataset(layout.CHECKSUMS, data=np.array([c for r in results for c in r.checksums],
                                                                        dtype="<u8")),
                       f.create_dataset(layout.KEYS, data=[self.source.keys[i] for i in kept],
                                        dtype=h5py.string_dtype("utf-8"))]
        f.attrs.update({"format": layout.FORMAT_ATTR, "store": self.opts.store,
                        "classes": json.dumps(self.source.classes),
                        "options": json.dumps(self.opts.recorded(registry.get("hdf5"))),
                        "schema": json.dumps([field.to_json() for field in self.source.schema])})
        if self.source.schema:
            self._write_fields(f, results)
        f.flush()  # a full disk fails here, with everything still open, rather than in a dataset's close
        # where each record lies, from the writer's own handle once every record is in place (chunk addresses do
        # not move at close); written beside data.h5 once it is closed
        self._extents = every_extent(self._records)

    def write_extents(self, count: int) -> None:
        found, self._extents = self._extents, None
        if found is not None:
            extentfile.write(self.root / layout.EXTENTS, *found)

    def _write_fields(self, f: h5py.File, results: List[TaskResult]) -> None:
        """fields/NAME and field_checksums/NAME, one pass over the staged fields."""
        n, schema = sum(len(r.field_lengths) for r in results), self.source.schema
        rows = [codec.fixed_row(field, self.opts.store, self.opts.size) for field in schema]
        outs = [f.create_dataset(f"{layout.FIELDS}/{field.name}", (n, *row[1]), row[0]) if row else
                f.create_dataset(f"{layout.FIELDS}/{field.name}", (n,), _vlen(field)) for field, row in zip(schema, rows)]
        self._held += outs
        for field, out in zip(schema, outs):
            if field.type in ("ndarray", "boxes"):
                out.attrs["shape"] = json.dumps(list(field.shape))
        records = FieldParts(self.root).read_all(results)
        for start in range(0, n, _ROWS):  # blocks of rows: h5py costs ~50 us a write call
            block = list(islice(records, _ROWS))
            for j, (field, out, row) in enumerate(zip(schema, outs, rows)):
                values = [v[j] for v in block]
                if row:
                    out[start:start + len(block)] = np.frombuffer(b"".join(values), row[0]).reshape(-1, *row[1])
                else:
                    column = np.empty(len(block), dtype=object)
                    for k, data in enumerate(values):  # one by one: equal-length rows would broadcast
                        column[k] = _vlen_value(field, data)
                    out.write_direct(column, dest_sel=np.s_[start:start + len(block)])
        for j, field in enumerate(schema):
            self._held.append(f.create_dataset(f"{layout.FIELD_CHECKSUMS}/{field.name}", data=np.array(
                [c[j] for r in results for c in r.field_checksums], dtype="<u8")))

    def _copy_pixels(self, first: int, kept: np.ndarray) -> None:
        images, staged = self._records, self.staging.pixels()
        for start in range(0, len(kept), _ROWS):
            rows = kept[start:start + _ROWS]
            images[first + start:first + start + len(rows)] = staged[rows]

    def _copy_encoded(self, first: int, result: TaskResult) -> None:
        encoded = self._records
        for block in _blocks(self.staging.records(result)):
            # write_direct, not ``encoded[a:b] = block``: h5py's __setitem__ turns an
            # object array of equal-length rows (one row, or two same-size files) into
            # a 2-D array and fails with "Can't broadcast (1, n) -> (1,)".
            encoded.write_direct(block, dest_sel=np.s_[first:first + len(block)])
            first += len(block)


def _vlen(field):
    if field.type in ("str", "json"):
        return h5py.string_dtype("utf-8")
    return h5py.vlen_dtype(stored_dtype(field.dtype) if field.dtype else np.uint8)


def _vlen_value(field, data: bytes):
    if field.type in ("str", "json"):
        return data.decode("utf-8")
    return np.frombuffer(data, stored_dtype(field.dtype) if field.dtype else np.uint8)


def _blocks(items: Iterator[bytes]) -> Iterator[np.ndarray]:
    """Object arrays of up to _ROWS uint8 arrays, as h5py writes variable-length rows."""
    items = iter(items)
    while block := list(islice(items, _ROWS)):
        out = np.empty(len(block), dtype=object)
        for j, data in enumerate(block):
            out[j] = np.frombuffer(data, dtype=np.uint8)
        yield out
