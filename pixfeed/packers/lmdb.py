"""Writer of the LMDB format.

Layout: one LMDB environment in a single file (opened with ``subdir=False``,
no lock file)::

    data.mdb      key b"%010d" % i (10 ASCII digits, record index, sorts in order)
                  value = 40-byte record header + stored bytes (pixfeed.record):
                    "<4sBBHqQIIQ": magic b"PXFR", version 1, kind (0 raw, 1 jpeg,
                    2 png), reserved 0, label int64, xxh3_64 uint64 of the stored
                    bytes, height uint32, width uint32, length uint64
                  stored bytes: raw = H x W x 3 uint8 RGB; jpeg/png = the file
                  key b"__pixfeed__" = JSON {"format", "count", "store", "classes",
                    "record_header"} for plain-lmdb users (it sorts after the records)
    keys.json, pixfeed.json

Reading one record with plain lmdb::

    env = lmdb.open("DST/data.mdb", subdir=False, readonly=True, lock=False)
    value = env.begin().get(b"%010d" % i)
    magic, ver, kind, _, label, xxh, h, w, n = struct.unpack_from("<4sBBHqQIIQ", value)
    data = value[40:40 + n]

Workers decode and stage records as the mmap format does (see
``pixfeed.packers.staging``); ``finish`` streams them into LMDB in
transactions of about 64 MiB.  The map starts at an estimate of the stored
bytes (plus one page per record) and doubles on MapFullError, retrying the
transaction; without ``writemap`` the file only ever holds written pages.  Any
other lmdb.Error (a full disk shows as "Input/output error") is raised as an
OSError naming data.mdb, which ``pack`` reports as an OutputError naming DST.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterator, List, Tuple

import lmdb
import numpy as np

from ..decode import sniff
from ..record import HEADER, pack_header
from .pipeline import TaskResult
from .staging import StagingWriter

log = logging.getLogger(__name__)
DATA = "data.mdb"
META_KEY = b"__pixfeed__"
_TXN_BYTES = 64 << 20
_PAGE = 4096


def record_key(i: int) -> bytes:
    return b"%010d" % i


def initial_map_size(count: int, stored_bytes: int) -> int:
    """Stored bytes plus headers, one page of slack per record, and 8 MiB."""
    return stored_bytes + count * (HEADER.size + _PAGE) + (8 << 20)


class LmdbWriter(StagingWriter):
    format = "lmdb"

    def finish(self, kept: np.ndarray, results: List[TaskResult]) -> dict:
        path = self.root / DATA
        try:
            self._write(path, kept, results)
        except lmdb.Error as e:  # not an OSError; MapFullError never gets here (_commit grows the map)
            raise OSError(None, f"LMDB write failed: {e}", str(path)) from e
        self.remove_staging()
        return {}

    def _write(self, path: Path, kept: np.ndarray, results: List[TaskResult]) -> None:
        stored = sum(r.stored_bytes for r in results)
        env = lmdb.open(str(path), subdir=False, lock=False, sync=False, metasync=False,
                        map_size=initial_map_size(len(kept), stored))
        try:
            for batch in _batches(self._items(kept, results)):
                _commit(env, batch)
            _commit(env, [(META_KEY, self._meta(len(kept)))])
            env.sync(True)
        finally:
            env.close()

    def _items(self, kept: np.ndarray, results: List[TaskResult]) -> Iterator[Tuple[bytes, bytes]]:
        checksums = (c for r in results for c in r.checksums)
        shapes = (s for r in results for s in r.shapes)
        labels = self.source.labels[kept]
        for j, data in enumerate(self.staged(kept, results)):
            kind = "raw" if self.opts.store == "pixels" else sniff(data).lower()
            header = pack_header(kind, int(labels[j]), next(checksums), next(shapes), memoryview(data).nbytes)
            yield record_key(j), b"".join((header, data))

    def _meta(self, count: int) -> bytes:
        return json.dumps({"format": "pixfeed-lmdb", "count": count, "store": self.opts.store,
                           "classes": self.source.classes, "record_header": HEADER.format}).encode()


def _batches(items: Iterator[Tuple[bytes, bytes]]) -> Iterator[list]:
    batch, size = [], 0
    for key, value in items:
        batch.append((key, value))
        size += len(value)
        if size >= _TXN_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _commit(env: lmdb.Environment, batch: list) -> None:
    """Write ``batch`` in one transaction, doubling the map size until it fits."""
    while True:
        try:
            with env.begin(write=True) as txn:
                for key, value in batch:
                    txn.put(key, value, append=True)
            return
        except lmdb.MapFullError:
            size = env.info()["map_size"] * 2
            log.debug("LMDB map full; growing it to %d bytes and retrying the transaction", size)
            env.set_mapsize(size)
