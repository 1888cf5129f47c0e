"""Writer of the HDF5 format.

Layout: one self-contained file, readable with plain h5py::

    data.h5
      images     pixels mode: uint8 N x H x W x 3 (RGB), chunked one image per
                 chunk, optionally compressed (--compression lzf|gzip)
      encoded    encoded mode: N variable-length uint8 arrays
                 (h5py.vlen_dtype(np.uint8)), each one JPEG or PNG file's bytes
      labels     int64 N   (-1 for a flat source)
      keys       utf-8 strings N (source path without extension)
      checksums  uint64 N  xxh3_64 of each record's stored bytes (uncompressed pixels)
      attrs      format "pixfeed-hdf5", store, classes (JSON list or null),
                 options (JSON object: the pack options)
    keys.json, pixfeed.json

Workers decode and stage records as the mmap format does, and the main
process copies each finished task into data.h5 in task order while the others
run (see ``pixfeed.packers.staging``): HDF5 has one writer, and a single file
(rather than per-task files joined by a virtual dataset) stays portable and
readable by any HDF5 tool.  ``images``/``encoded`` are created with a row per
source image and shrunk to N at the end when images were skipped.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from itertools import islice
from typing import Iterator, List

import h5py
import numpy as np

from ..errors import OptionError
from .writer import TaskResult
from .staging import StagingWriter

DATA = "data.h5"
COMPRESSIONS = ("lzf", "gzip")
_ROWS = 256


class H5Writer(StagingWriter):
    format = "hdf5"

    def begin(self, tasks: List[np.ndarray]) -> None:
        compression = self.opts.compression
        if compression is not None and compression not in COMPRESSIONS:
            raise OptionError(f"--compression {compression!r}: expected lzf or gzip")
        if compression is not None and self.opts.store != "pixels":
            raise OptionError(f"--compression {compression} applies to --store pixels only; "
                              "JPEG and PNG bytes are already compressed")
        super().begin(tasks)

    def open_output(self) -> h5py.File:
        """data.h5 with a row for every source image; ``complete_output`` drops
        those of skipped images (never written, so never stored)."""
        f = h5py.File(self.root / DATA, "w")
        try:
            self._create(f, len(self.source))
        except BaseException:
            f.close()
            raise
        return f

    def _create(self, f: h5py.File, n: int) -> None:
        if self.opts.store == "pixels":
            shape = (n, *self.opts.size, 3)
            f.create_dataset("images", shape, np.uint8, maxshape=shape, chunks=(1, *shape[1:]),
                             compression=self.opts.compression)
        else:
            f.create_dataset("encoded", (n,), h5py.vlen_dtype(np.uint8), maxshape=(n,))

    def copy_task(self, first: int, result: TaskResult) -> None:
        if self.opts.store == "pixels":
            self._copy_pixels(first, np.asarray(result.kept, dtype=np.int64))
        else:
            self._copy_encoded(first, result)

    def complete_output(self, kept: np.ndarray, results: List[TaskResult]) -> None:
        f = self.output
        f["images" if self.opts.store == "pixels" else "encoded"].resize(len(kept), axis=0)
        f["labels"] = self.source.labels[kept].astype("<i8")
        f["checksums"] = np.array([c for r in results for c in r.checksums], dtype="<u8")
        f.create_dataset("keys", data=[self.source.keys[i] for i in kept], dtype=h5py.string_dtype("utf-8"))
        f.attrs.update({"format": "pixfeed-hdf5", "store": self.opts.store,
                        "classes": json.dumps(self.source.classes),
                        "options": json.dumps(asdict(self.opts), default=str)})

    def _copy_pixels(self, first: int, kept: np.ndarray) -> None:
        images, staged = self.output["images"], self.staged_pixels()
        for start in range(0, len(kept), _ROWS):
            rows = kept[start:start + _ROWS]
            images[first + start:first + start + len(rows)] = staged[rows]

    def _copy_encoded(self, first: int, result: TaskResult) -> None:
        encoded = self.output["encoded"]
        for block in _blocks(self.staged_records(result)):
            # write_direct, not ``encoded[a:b] = block``: h5py's __setitem__ turns an
            # object array of equal-length rows (one row, or two same-size files) into
            # a 2-D array and fails with "Can't broadcast (1, n) -> (1,)".
            encoded.write_direct(block, dest_sel=np.s_[first:first + len(block)])
            first += len(block)


def _blocks(items: Iterator[bytes]) -> Iterator[np.ndarray]:
    """Object arrays of up to _ROWS uint8 arrays, as h5py writes variable-length rows."""
    items = iter(items)
    while block := list(islice(items, _ROWS)):
        out = np.empty(len(block), dtype=object)
        for j, data in enumerate(block):
            out[j] = np.frombuffer(data, dtype=np.uint8)
        yield out
