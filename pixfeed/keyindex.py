"""The key index: one record's key looked up without loading every key.

Two files beside ``keys.json`` (which stays, for stock tools: ``json.load``
gives the list), named in the manifest's ``key_index`` entry::

    keys.offsets.npy   uint64 [N + 1]: byte offsets into keys.utf8 (numpy.load(mmap_mode="r") reads it)
    keys.utf8          the keys' UTF-8 bytes, concatenated in record order

Key ``i`` is ``keys.utf8[offsets[i]:offsets[i + 1]]`` decoded as UTF-8.  A
lookup reads the key's bytes from the mapped offsets, so no process holds one
Python object per record for its keys (``keys.json`` of 10M records was
180 MB of JSON parsed into a list in every process that named a record).
Datasets packed before the index have no ``key_index``: their keys come from
``keys.json``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from .errors import CorruptDataError, PixfeedError
from .storage.bounded import MANIFEST_BYTES, check_size, read_open
from .storage.paths import map_inside, open_inside

OFFSETS, BLOB = "keys.offsets.npy", "keys.utf8"


def write(folder: Path, keys: Sequence[str]) -> dict:
    """Write the index of ``keys`` into ``folder``; return the manifest entry that names it."""
    encoded = [k.encode("utf-8") for k in keys]
    offsets = np.zeros(len(encoded) + 1, dtype=np.uint64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    np.save(folder / OFFSETS, offsets)
    with open(folder / BLOB, "wb") as f:
        f.write(b"".join(encoded))
    return {"key_index": {"offsets": OFFSETS, "blob": BLOB}}


class KeyIndex:
    """The index named by the manifest's ``entry``, opened once (a dataset keeps one per process): the
    offsets mapped and the keys' file held open, so a lookup is a slice and a ``pread``.  Opening
    both for every lookup cost 330 us a key.  Neither file is read whole: a lookup reads one key's
    bytes, after checking that the offsets name bytes the keys' file holds (a hostile index cannot
    make it read past the file or allocate what the offsets claim); a FIFO or device is refused unread."""

    def __init__(self, folder: Path, entry: dict, allow_links: bool = False) -> None:
        self.offsets = _offsets(folder, entry["offsets"], allow_links)
        self.where = Path(folder) / entry["blob"]
        fd = open_inside(folder, entry["blob"], allow_links)  # no link followed, even one swapped in
        self.size = os.fstat(fd).st_size
        self.blob = os.fdopen(fd, "rb", buffering=0)  # closed with the index

    def __getitem__(self, i: int) -> str:
        """Key ``i``; IndexError outside the records, CorruptDataError where the offsets leave the file."""
        if not 0 <= i < len(self.offsets) - 1:
            raise IndexError(f"record {i} of {len(self.offsets) - 1}")
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if not 0 <= start <= end <= self.size:
            raise CorruptDataError(f"{self.where}: the key index gives record {i} bytes {start} to {end} of a "
                                   f"{self.size}-byte file; the index is damaged")
        check_size(end - start, MANIFEST_BYTES, f"{self.where}: record {i}", "key")  # no more than keys.json holds
        return _decode(os.pread(self.blob.fileno(), end - start, start), self.where, i)


def read_all(folder: Path, entry: dict, count: Optional[int] = None, allow_links: bool = False) -> List[str]:
    """Every key, in record order (for tools that need them all: a repack, ``pixfeed info``): the keys'
    file read within MANIFEST_BYTES (the limit of ``keys.json``, which holds the same keys and more), the
    offsets checked to rise within it and, given ``count``, to number no more than ``count + 1``."""
    offsets = _offsets(folder, entry["offsets"], allow_links)
    where = Path(folder) / entry["blob"]
    if count is not None and len(offsets) > count + 1:  # fewer: the records' own check names it
        raise CorruptDataError(f"{Path(folder) / entry['offsets']}: {len(offsets)} offsets for {count} records "
                               f"({count + 1} expected); the key index is damaged")
    blob = read_open(open_inside(folder, entry["blob"], allow_links), MANIFEST_BYTES, where, "keys file")
    if offsets[0] != 0 or int(offsets[-1]) > len(blob) or (offsets[1:] < offsets[:-1]).any():
        raise CorruptDataError(f"{where}: the key index's offsets do not rise from 0 within the file's {len(blob)} "
                               "bytes; the index is damaged")
    bounds = offsets.tolist()
    return [_decode(blob[a:b], where, i) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]


def _offsets(folder: Path, rel: str, allow_links: bool = False) -> np.ndarray:
    """The mapped offsets ``folder/rel``: a 1-D array of unsigned integers, else CorruptDataError; a special
    file SpecialFileError before numpy opens it (it would block on a FIFO), a link OutsideDatasetError
    (``open_inside``: numpy maps the file that was opened and checked)."""
    path = Path(folder) / rel
    try:
        offsets = map_inside(folder, rel, allow_links)
    except PixfeedError:  # a link (OutsideDatasetError), a special file: named already
        raise
    except ValueError as e:
        raise CorruptDataError(f"{path}: not a readable key index ({e})") from None
    if offsets.ndim != 1 or offsets.dtype.kind != "u" or not len(offsets):
        raise CorruptDataError(f"{path}: the key index is {offsets.dtype} {offsets.shape}, not unsigned offsets "
                               "[count + 1]; the index is damaged")
    return offsets


def _decode(raw: bytes, where: Path, i: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptDataError(f"{where}: key of record {i} is not UTF-8 ({e}); the index is damaged") from None
