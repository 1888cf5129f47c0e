"""Each record's byte range in its data file, written beside it once, at pack time (``extents.npy``).

A single-writer format (LMDB, HDF5) places records where its library chooses,
so a reader finds where record ``i`` lies only by asking the library: on a
cold file that lookup waits for a random read of the record's own pages (an
LMDB value's first page, HDF5's chunk index), and read-ahead, which needs the
byte ranges of the records it is about to request, then waits on the very
reads it means to start.  So the packer writes the ranges once the data file
is final: an N x 2 little-endian int64 ``.npy`` (row ``i``: start and length of
record ``i``'s stored bytes), listed in the manifest's files with its hash,
loadable with ``numpy.load(path, mmap_mode="r")`` (no pickle).

``FileRanges`` gives read-ahead (``pagecache.Extents``) the ranges of a window
of records at a time from the memory-mapped file (nothing per record copied
into the process).  They are hints: the readers still read every record
through their library and check its checksum, so a wrong range costs a
wasted read, never a wrong pixel; ranges are clipped to the data file's
listed size, so a damaged one can ask for nothing outside it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from ..errors import CorruptDataError, PixfeedError
from .paths import map_inside

DTYPE = "<i8"


def write(path: Path, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Write the ranges (one row per record, in record order) as ``path``."""
    table = np.empty((len(starts), 2), DTYPE)
    table[:, 0], table[:, 1] = starts, lengths
    np.save(path, table, allow_pickle=False)


def listed(dataset, data: str, name: str) -> Optional["FileRanges"]:
    """The ``FileRanges`` of a pixfeed dataset reader's file ``name`` (ranges in its data file ``data``) when
    its manifest lists one; None for a pack made before it."""
    files = dataset.manifest["files"]
    if name not in files:
        return None
    return FileRanges(dataset.path, name, len(dataset), files[data]["bytes"], dataset.allow_links)


class FileRanges:
    """(starts, lengths) of records from ``root/name`` (``write``'s file), memory-mapped and checked to
    hold ``count`` rows of two 64-bit integers when made: a file that does not is a CorruptDataError
    naming it.  ``size``: the data file's bytes, which every range is clipped to."""

    def __init__(self, root: Path, name: str, count: int, size: int, allow_links: bool = False) -> None:
        self.where, self.count, self.size = (Path(root), name, allow_links), count, size
        self.table = self._map()

    def _map(self) -> np.ndarray:
        root, name, allow_links = self.where
        path = root / name
        try:
            table = map_inside(root, name, allow_links)  # the file checked is the file mapped
        except PixfeedError:  # a link (OutsideDatasetError), a special file: named already
            raise
        except FileNotFoundError:
            raise CorruptDataError(f"{path}: missing, but listed in the manifest; the dataset is damaged") from None
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - not a .npy, a pickle, too short, a header that does not parse
            raise CorruptDataError(f"{path}: not a NumPy array file pixfeed can read ({e}); the dataset is "
                                   "damaged (pixfeed verify names more)") from None
        if table.shape != (self.count, 2) or table.dtype.kind not in "iu" or table.dtype.itemsize != 8:
            raise CorruptDataError(f"{path}: holds {table.dtype} of shape {table.shape}, but the manifest's count "
                                   f"is {self.count:,} (so ({self.count}, 2) of 64-bit integers: each record's "
                                   "start and length); the dataset is damaged (pixfeed verify names more)")
        return table

    def __getstate__(self) -> dict:
        return {**self.__dict__, "table": None}  # mapped again where it is used, never copied into a pickle

    def __call__(self, records: np.ndarray) -> tuple:
        if self.table is None:
            self.table = self._map()
        rows = self.table[np.asarray(records, np.int64)]
        starts = np.clip(rows[:, 0].astype(np.int64), 0, self.size)
        return starts, np.clip(rows[:, 1].astype(np.int64), 0, self.size - starts)
