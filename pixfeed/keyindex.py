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
from typing import List, Sequence

import numpy as np

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
    both for every lookup cost 330 us a key."""

    def __init__(self, folder: Path, entry: dict) -> None:
        self.offsets = np.load(Path(folder) / entry["offsets"], mmap_mode="r")
        self.blob = open(Path(folder) / entry["blob"], "rb", buffering=0)  # closed with the index

    def __getitem__(self, i: int) -> str:
        """Key ``i``; IndexError outside the records."""
        if not 0 <= i < len(self.offsets) - 1:
            raise IndexError(f"record {i} of {len(self.offsets) - 1}")
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return os.pread(self.blob.fileno(), end - start, start).decode("utf-8")


def read_all(folder: Path, entry: dict) -> List[str]:
    """Every key, in record order (for tools that need them all: a repack, ``pixfeed info``)."""
    offsets = np.load(Path(folder) / entry["offsets"], mmap_mode="r")
    blob = (Path(folder) / entry["blob"]).read_bytes()
    bounds = offsets.tolist()
    return [blob[a:b].decode("utf-8") for a, b in zip(bounds[:-1], bounds[1:])]
