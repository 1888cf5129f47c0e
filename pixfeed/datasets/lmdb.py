"""Reader of the LMDB format (layout: pixfeed.layouts.lmdb, record: pixfeed.record).

py-lmdb refuses to open one file twice in a process, and counts environments
inherited through fork.  So environments are shared per process by file
identity (two datasets on one path, or a pickled copy, use one), and a forked
child closes the ones it inherited before opening its own.
"""
from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from ..errors import CorruptDataError
from ..layouts.lmdb import DATA, record_key
from ..record import Header, parse
from .base import MapImageDataset

_ENVS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (st_dev, st_ino) -> lmdb.Environment
_LOCK = threading.Lock()


def environment(path: str):
    """The process's read-only environment of the LMDB file ``path``."""
    import lmdb

    st = os.stat(path)
    with _LOCK:
        env = _ENVS.get((st.st_dev, st.st_ino))
        if env is None:
            env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False, meminit=False)
            _ENVS[st.st_dev, st.st_ino] = env
    return env


def _close_inherited() -> None:
    global _LOCK
    _LOCK = threading.Lock()
    for env in list(_ENVS.values()):
        env.close()
    _ENVS.clear()


os.register_at_fork(after_in_child=_close_inherited)


class LmdbImageDataset(MapImageDataset):
    """``LmdbImageDataset(path, transform=None, *, size=None, crop="center", crop_ratio=None,
    checksums=True, exact=False)``.

    The environment is opened read-only without a lock file on first access in
    each process; a batch of indices is read in one transaction.
    """
    format = "lmdb"

    def _open(self):
        return environment(str(self.path / DATA))

    def read_stored(self, indices: np.ndarray):
        """Pixels mode: one N x H x W x 3 array; encoded mode: a list of bytes."""
        shape = self.stored_shape  # None in encoded mode
        stored = np.empty((len(indices), *shape), np.uint8) if shape else []
        labels = np.empty(len(indices), np.int64)
        checksums = np.empty(len(indices), np.uint64)
        with self.handle.begin(buffers=True) as txn:
            for j, i in enumerate(indices):
                header, data = self._parse(txn, int(i))
                if shape:
                    stored[j] = np.frombuffer(data, np.uint8).reshape(shape)
                else:
                    stored.append(bytes(data))
                labels[j], checksums[j] = header.label, header.checksum
        return stored, labels, checksums

    def _parse(self, txn, i: int):
        """Header and stored bytes of record ``i``; CorruptDataError names the index and both keys."""
        key = record_key(i)
        value = txn.get(key)
        try:
            if value is None:
                raise CorruptDataError(f"key {key.decode()}: missing from the LMDB environment")
            header, data = parse(value, f"key {key.decode()}")
            self._check_kind(header, key)
        except CorruptDataError as e:
            raise CorruptDataError(f"{self.where(i)}, {DATA} {e}") from None
        return header, data

    def _check_kind(self, header: Header, key: bytes) -> None:
        shape = self.stored_shape
        ok = header.kind == "raw" and (header.height, header.width) == shape[:2] if shape else header.kind != "raw"
        if not ok:
            raise CorruptDataError(f"key {key.decode()}: a {header.height}x{header.width} {header.kind} record "
                                   f"in a {self.store} dataset of shape {shape}")
