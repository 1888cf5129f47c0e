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

Workers decode and stage records as the mmap format does (see
``pixfeed.packers.staging``) and ``finish`` copies them into data.h5: HDF5
has one writer, and a single file (rather than per-task files joined by a
virtual dataset) stays portable and readable by any HDF5 tool.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from itertools import islice
from typing import Iterator, List

import h5py
import numpy as np

from ..errors import OptionError
from .pipeline import TaskResult
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

    def finish(self, kept: np.ndarray, results: List[TaskResult]) -> dict:
        with h5py.File(self.root / DATA, "w") as f:
            if self.opts.store == "pixels":
                self._write_pixels(f, kept)
            else:
                self._write_encoded(f, len(kept), results)
            f["labels"] = self.source.labels[kept].astype("<i8")
            f["checksums"] = np.array([c for r in results for c in r.checksums], dtype="<u8")
            f.create_dataset("keys", data=[self.source.keys[i] for i in kept], dtype=h5py.string_dtype("utf-8"))
            f.attrs.update({"format": "pixfeed-hdf5", "store": self.opts.store,
                            "classes": json.dumps(self.source.classes),
                            "options": json.dumps(asdict(self.opts), default=str)})
        self.remove_staging()
        return {}

    def _write_pixels(self, f: h5py.File, kept: np.ndarray) -> None:
        h, w = self.opts.size
        images = f.create_dataset("images", (len(kept), h, w, 3), np.uint8, chunks=(1, h, w, 3),
                                  compression=self.opts.compression)
        staged = self.staged_pixels()
        for start in range(0, len(kept), _ROWS):
            images[start:start + _ROWS] = staged[kept[start:start + _ROWS]]

    def _write_encoded(self, f: h5py.File, count: int, results: List[TaskResult]) -> None:
        encoded = f.create_dataset("encoded", (count,), h5py.vlen_dtype(np.uint8))
        start = 0
        for block in _blocks(self.staged_encoded(results)):
            # write_direct, not ``encoded[a:b] = block``: h5py's __setitem__ turns an
            # object array of equal-length rows (one row, or two same-size files) into
            # a 2-D array and fails with "Can't broadcast (1, n) -> (1,)".
            encoded.write_direct(block, dest_sel=np.s_[start:start + len(block)])
            start += len(block)


def _blocks(items: Iterator[bytes]) -> Iterator[np.ndarray]:
    """Object arrays of up to _ROWS uint8 arrays, as h5py writes variable-length rows."""
    items = iter(items)
    while block := list(islice(items, _ROWS)):
        out = np.empty(len(block), dtype=object)
        for j, data in enumerate(block):
            out[j] = np.frombuffer(data, dtype=np.uint8)
        yield out
