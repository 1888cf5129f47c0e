"""Writer of the LMDB format (layout: ``pixfeed.layouts.lmdb``).

Workers decode records and stage each as its whole LMDB value (header, stored
bytes, field table) in a part file of their task (``pixfeed.packers.staging``),
and the main process puts each finished task's values, views of a map of its
part (read or joined by nothing but LMDB), into LMDB in task order while the
others run, in
transactions of about 8 MiB (small
enough to commit while the workers run).  The map starts at an estimate of the
stored bytes of every source image (plus one page per record) and doubles on
MapFullError, retrying the transaction; without ``writemap`` the file only
ever holds written pages.  Any
other lmdb.Error (a full disk shows as "Input/output error") is raised as an
OSError naming data.mdb, which ``pack`` reports as an OutputError naming DST.
Once data.mdb is closed, one read-only cursor pass in key order (record order)
writes where each value lies in it as ``extents.npy`` (``write_extents``).
"""
from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Sequence, Tuple

import lmdb
import numpy as np

from ..layouts.lmdb import DATA, EXTENTS, META_FORMAT, META_KEY, record_key
from ..record import HEADER, pack_fields, pack_header
from ..sources.folder import Source
from ..storage import extentfile
from ..storage.pagecache import mapping_base
from .options import PackOptions
from .records import Record
from .staging import StagedWriter
from .writer import TaskResult

log = logging.getLogger(__name__)
_TXN_BYTES = 8 << 20
_PAGE = 4096


def initial_map_size(count: int, stored_bytes: int) -> int:
    """Stored bytes plus headers, one page of slack per record, and 8 MiB."""
    return stored_bytes + count * (HEADER.size + _PAGE) + (8 << 20)


class LmdbWriter(StagedWriter):
    """Stages records, then commits them into data.mdb (one writer) in task order."""
    rows = False       # pixels are staged as values too
    own_fields = True  # fields go into each value's table, in the worker

    def __init__(self, root: Path, source: Source, opts: PackOptions) -> None:
        super().__init__(root, source, opts)
        # records wait for a transaction of _TXN_BYTES, across tasks: a transaction per
        # task would leave stale copies of the leaf pages it shares with the next one
        self._batch: List[Tuple[bytes, memoryview]] = []
        self._batch_bytes = 0

    def open_output(self) -> lmdb.Environment:
        if self.opts.store == "pixels":
            h, w = self.opts.size
            expected = len(self.source) * h * w * 3
        else:
            expected = int(self.source.sizes.sum())
        with self._errors():
            return lmdb.open(str(self.root / DATA), subdir=False, lock=False, sync=False, metasync=False,
                             map_size=initial_map_size(len(self.source), expected))

    def parts(self, rec: Record) -> Sequence:
        """A record's LMDB value (in a worker): header, stored bytes, field table."""
        data = memoryview(rec.data).cast("B")
        return [pack_header(rec.encoding, rec.label, rec.checksum, rec.shape, data.nbytes), data,
                pack_fields(list(rec.fields.values()), rec.field_checksums)]

    def copy_task(self, first: int, result: TaskResult) -> None:
        for j, value in enumerate(self.staging.records(result)):
            self._batch.append((record_key(first + j), value))
            self._batch_bytes += value.nbytes
            if self._batch_bytes >= _TXN_BYTES:
                self._commit_batch()

    def complete_output(self, kept: np.ndarray, results: List[TaskResult]) -> None:
        if self._batch:
            self._commit_batch()
        with self._errors():
            _commit(self.output, [(META_KEY, self._meta(len(kept)))])
            self.output.sync(True)

    def write_extents(self, count: int) -> None:
        """``extents.npy``: each record's value as the reader finds it (its address in LMDB's map of the
        file minus the map's base: an offset in data.mdb), one cursor pass over the closed file in key
        order (a Python step per record: LMDB has no call for many).  py-lmdb touches every page of each
        value it hands out, so the pass reads the whole file where it is no longer cached (a pack larger
        than memory): in file order, with the kernel's read-ahead on (0.55 GiB cold: 0.3 s, against 12 s
        with ``readahead=False``, the readers' setting for random reads)."""
        starts, lengths = np.empty(count, np.int64), np.empty(count, np.int64)
        path = self.root / DATA
        with self._errors():
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=True)
            try:
                base = mapping_base(path)
                with env.begin(buffers=True) as txn:
                    cursor = txn.cursor()
                    found = cursor.set_key(record_key(0))
                    for j in range(count):
                        if not found or cursor.key() != record_key(j):
                            raise OSError(None, f"LMDB holds no record {j} where written", str(path))
                        value = cursor.value()
                        starts[j], lengths[j] = np.frombuffer(value, np.uint8).ctypes.data - base, len(value)
                        found = cursor.next()
            finally:
                env.close()
        extentfile.write(self.root / EXTENTS, starts, lengths)

    def _commit_batch(self) -> None:
        with self._errors():
            _commit(self.output, self._batch)
        self._batch, self._batch_bytes = [], 0

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Raise an lmdb.Error (not an OSError) as an OSError naming data.mdb; MapFullError
        never gets here (_commit grows the map)."""
        try:
            yield
        except lmdb.Error as e:
            raise OSError(None, f"LMDB write failed: {e}", str(self.root / DATA)) from e

    def _meta(self, count: int) -> bytes:
        return json.dumps({"format": META_FORMAT, "count": count, "store": self.opts.store,
                           "classes": self.source.classes, "record_header": HEADER.format,
                           "schema": [f.to_json() for f in self.source.schema]}).encode()


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
