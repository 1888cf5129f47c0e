"""Staging for the single-writer formats (lmdb, hdf5).

LMDB and HDF5 files take one writer, but decoding should still run in every
pack worker.  So workers write exactly as the mmap format does: pixels into
their own rows of a pre-sized ``images.npy``, in place; encoded bytes into one
part file per task (``parts/part-NNNNNN.bin``).  No decoded pixels go through
a pipe.  ``finish`` then streams the staged records, in record order, into
the one output file and removes the staging files, so the finished dataset
holds only the format's own files.
"""
from __future__ import annotations

import shutil
from typing import Iterator, List

import numpy as np

from .mmap import MmapWriter
from .pipeline import TaskResult


class StagingWriter(MmapWriter):
    """Base of a writer whose ``finish`` converts the mmap-style staging files."""
    default_store = "encoded"

    def staged_pixels(self) -> np.ndarray:
        """The staged N_source x H x W x 3 pixels (rows of skipped images are zero)."""
        return np.load(self._images, mmap_mode="r")

    def staged_encoded(self, results: List[TaskResult]) -> Iterator[bytes]:
        """The stored bytes of every kept record, in record order."""
        for r in results:
            with open(self._part(r.task), "rb") as f:
                for length in r.extra:
                    yield f.read(length)

    def staged(self, kept: np.ndarray, results: List[TaskResult]) -> Iterator:
        """Stored records (pixel rows or encoded bytes) of every kept record, in order."""
        if self.opts.store == "pixels":
            images = self.staged_pixels()
            return (images[i] for i in kept)
        return self.staged_encoded(results)

    def remove_staging(self) -> None:
        if self.opts.store == "pixels":
            self._images.unlink()
        else:
            shutil.rmtree(self.root / "parts")
