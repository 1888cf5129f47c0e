"""Reader of the LMDB format (layout: pixfeed.layouts.lmdb, record: pixfeed.record).

py-lmdb refuses to open one file twice in a process, and counts environments
inherited through fork.  So environments are shared per process by file
identity (two datasets on one path, or a pickled copy, use one), and a forked
child closes the ones it inherited before opening its own.

LMDB reads through a memory map of the whole file, so every page a process
touches counts in its RSS.  When the dataset does not fit in the page cache
this process may keep (``pixfeed.machine.memory.fits_in_page_cache``), the reader drops
its mapped pages after each ``UNMAP_EVERY`` bytes read
(``pagecache.unmap_pages``; they stay in the page cache until reclaimed, and
the next touch maps them back).  A dataset that fits keeps its mapping: mapping
pages back costs more than the copy (2.8 vs 8 GB/s for 256x256 records here).  Read-ahead
(``record_extents``): a record's value is contiguous in the file (overflow pages
for values larger than a page), at the address LMDB hands out minus the
address the file is mapped at; the packer writes them all to ``extents.npy``,
and packs made before it have them looked up as read-ahead needs them.
"""
from __future__ import annotations

import os
import struct
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from ..image import buffers as batchbuffers
from ..errors import CorruptDataError
from ..layouts.lmdb import DATA, EXTENTS, record_key
from ..machine.memory import fits_in_page_cache
from ..storage import extentfile
from ..storage.paths import open_inside, opened_path
from ..storage.pagecache import Extents, mapping_base, unmap_pages
from ..record import Header, field_table, parse
from .base import MapImageDataset

_ENVS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (st_dev, st_ino) -> lmdb.Environment
_ENDS: dict = {}  # (st_dev, st_ino) -> (map's base address, the address past the file's bytes in it)
_LOCK = threading.Lock()
UNMAP_EVERY = 16 << 20
CLOSE_WAIT = 2.0  # seconds to wait for an environment of the same file closing in another thread
LOOKUPS = 32  # record addresses looked up at once for read-ahead (py-lmdb's get releases the GIL)


# A meta page (pages 0 and 1; LMDB's MDB_meta on 64-bit): magic and version at 16, the page size at 40 (the
# free database's md_pad), the last page number at 136.
_MAGIC, _VERSION, _PAGE_SIZE, _LAST_PAGE = (struct.Struct("<I"), 16), (struct.Struct("<I"), 20), \
    (struct.Struct("<I"), 40), (struct.Struct("<Q"), 136)


def check_meta(fd: int, where: object) -> int:
    """The size of the LMDB file open as ``fd`` once both meta pages are checked against it: LMDB maps the
    file and reads any page below the meta's last page number without a check, so a file shorter than the
    meta claims (a truncated copy) would kill the process with SIGBUS.  CorruptDataError naming the file
    ``where`` otherwise."""
    size = os.fstat(fd).st_size

    def field(page: bytes, spec) -> int:
        return spec[0].unpack_from(page, spec[1])[0]

    first = os.pread(fd, 144, 0)
    psize = field(first, _PAGE_SIZE) if len(first) == 144 else 0
    pages = [first, os.pread(fd, 144, psize) if psize else b""]
    if not (psize & (psize - 1) == 0 and 512 <= psize <= 1 << 16):
        raise CorruptDataError(f"{where}: not an LMDB file (no meta page with a page size at its start; "
                               f"{size:,} bytes); the dataset is damaged")
    for n, page in enumerate(pages):
        if len(page) < 144 or field(page, _MAGIC) != 0xBEEFC0DE or field(page, _VERSION) != 1:
            raise CorruptDataError(f"{where}: meta page {n} is not an LMDB (64-bit, version 1) meta page; the "
                                   "file is truncated or damaged")
        last = field(page, _LAST_PAGE)
        if (last + 1) * psize > size:
            raise CorruptDataError(f"{where}: meta page {n} says the file holds {last + 1:,} pages of {psize:,} "
                                   f"bytes, but it has {size:,} bytes; the file is truncated or damaged")
    return size


def environment(root: Path, allow_links: bool = False) -> tuple:
    """(environment, map's base address, address past the bytes the file backs) of the process's read-only
    environment of ``root``'s data.mdb: the file ``open_inside`` opened (no link followed, even one swapped
    in after open_dataset's scan, unless ``allow_links``), its meta pages checked (``check_meta``), and
    LMDB made to open that very file (``opened_path``); LMDB's own errors a CorruptDataError naming it."""
    import lmdb

    path = Path(root) / DATA
    fd = open_inside(root, DATA, allow_links)
    try:
        st = os.fstat(fd)
        with _LOCK:
            env = _ENVS.get((st.st_dev, st.st_ino))
            if env is None:
                size = check_meta(fd, path)
                opened = opened_path(fd, path)
                env = _open_env(lmdb, opened, path)
                base = mapping_base(opened)
                _ENVS[st.st_dev, st.st_ino] = env
                _ENDS[st.st_dev, st.st_ino] = base, base + min(size, env.info()["map_size"])
            return (env, *_ENDS[st.st_dev, st.st_ino])
    finally:
        os.close(fd)


def _open_env(lmdb, opened: str, path: Path):
    """LMDB's read-only environment of the file at ``opened``.  py-lmdb refuses a file while another
    environment of it is open in the process; the last one of ours may be closing in another thread (its weak
    reference already gone from ``_ENVS``, py-lmdb's close not yet done): waited for, up to ``CLOSE_WAIT`` s."""
    deadline = time.monotonic() + CLOSE_WAIT
    while True:
        try:
            return lmdb.open(opened, subdir=False, readonly=True, lock=False, readahead=False, meminit=False)
        except lmdb.Error as e:
            if "already open in this process" in str(e) and time.monotonic() < deadline:
                time.sleep(0.005)
                continue
            raise CorruptDataError(f"{path}: LMDB cannot open it ({e}); the file is damaged") from None


def _close_inherited() -> None:
    global _LOCK
    _LOCK = threading.Lock()
    for env in list(_ENVS.values()):
        env.close()
    _ENVS.clear()
    _ENDS.clear()


os.register_at_fork(after_in_child=_close_inherited)


class LmdbImageDataset(MapImageDataset):
    """``LmdbImageDataset(path, transform=None, *, size=None, crop="center", crop_ratio=None,
    checksums=True, exact=False)``.

    The environment is opened read-only without a lock file on first access in
    each process; a batch of indices is read in one transaction.
    """
    format = "lmdb"
    _mapped = 0  # bytes read through the map since its pages were last dropped

    def _open(self):
        env, _, self._end = environment(self.path, self.allow_links)
        return env

    def read_stored(self, indices: np.ndarray):
        """Pixels mode: one N x H x W x 3 array; encoded mode: a list of bytes."""
        shape = self.stored_shape  # None in encoded mode
        stored = batchbuffers.empty((len(indices), *shape)) if shape else []
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
        self._unmap_behind(stored.nbytes if shape else sum(map(len, stored)))
        return stored, labels, checksums

    def iter_verified(self, indices, block: int = 256):
        """Encoded records as views of the map, read in one transaction held while they are used (no
        copy out of it, as ``read_stored`` must make); pixels as the base class reads them."""
        if self.stored_shape:
            yield from super().iter_verified(indices, block)
            return
        with self.handle.begin(buffers=True) as txn:
            for i in self._indices(indices).tolist():
                header, data = self._parse(txn, i)
                self.check_checksum(data, header.checksum, i)
                yield i, data, header.checksum
                self._unmap_behind(len(data))

    def _unmap_behind(self, nbytes: int) -> None:
        """Each ``UNMAP_EVERY`` bytes read, drop the mapped pages when the dataset does not fit in the page
        cache (asked once each time: the question reads /proc and the cgroup's files)."""
        self._mapped += nbytes
        if self._mapped > UNMAP_EVERY:
            if not fits_in_page_cache(self.manifest["files"][DATA]["bytes"]):
                unmap_pages(self.path / DATA)
            self._mapped = 0

    def record_extents(self) -> Extents:
        """Where each record's value lies in ``data.mdb``: from the pack's ``extents.npy`` (memory-mapped,
        nothing per record kept, no lookup waiting on storage), or, in a pack made before it, looked up for
        the records read-ahead is about to request, a window of the order at a time, ``LOOKUPS`` parts at
        once (a lookup in a cold file waits for the value's first page: 4,000 records of 256x256 read cold at
        37 MB/s with them looked up one by one)."""
        listed = extentfile.listed(self, DATA, EXTENTS)
        if listed is not None:
            return self.lazy_extents(DATA, listed)
        extents = self.lazy_extents(DATA, self._value_ranges)
        extents.lookups = LOOKUPS
        return extents

    def _value_ranges(self, records: np.ndarray) -> tuple:
        path = self.path / DATA
        starts, lengths = np.empty(len(records), np.int64), np.empty(len(records), np.int64)
        env, base, end = environment(self.path, self.allow_links)
        with env.begin(buffers=True) as txn:
            for j, i in enumerate(np.asarray(records).tolist()):
                value = txn.get(record_key(i))
                if value is None:
                    raise CorruptDataError(f"{self.where(i)}: key {record_key(i).decode()} missing from {path}")
                starts[j], lengths[j] = np.frombuffer(value, np.uint8).ctypes.data - base, len(value)
                if base + starts[j] + lengths[j] > end:
                    raise CorruptDataError(f"{self.where(i)}: key {record_key(i).decode()} runs past the end of "
                                           f"{path}")
        return starts, lengths

    def read_labels(self, indices: np.ndarray) -> np.ndarray:
        with self.handle.begin(buffers=True) as txn:
            return np.array([self._parse(txn, int(i))[0].label for i in indices], np.int64)

    def read_fields(self, indices: np.ndarray, names) -> list:
        position = {f.name: k for k, f in enumerate(self.schema)}
        out = []
        with self.handle.begin(buffers=True) as txn:
            for i in indices:
                header, _, value = self._parse(txn, int(i), whole=True)
                try:
                    table = field_table(value, header, f"key {record_key(int(i)).decode()}")
                    if len(table) != len(self.schema):
                        raise CorruptDataError(f"{len(table)} fields in the record, {len(self.schema)} in the schema")
                except CorruptDataError as e:
                    raise CorruptDataError(f"{self.where(int(i))}, {DATA}: {e}") from None
                for name in names:
                    self.check_field(name, table[position[name]][0], table[position[name]][1], int(i))
                out.append({name: bytes(table[position[name]][0]) for name in names})
        return out

    def _parse(self, txn, i: int, whole: bool = False):
        """Header and stored bytes of record ``i`` (and ``whole``: its whole value); CorruptDataError
        names the index and both keys."""
        import lmdb

        key = record_key(i)
        try:
            try:
                value = txn.get(key)
            except lmdb.Error as e:  # a page LMDB finds damaged (its number past the last page, a bad kind)
                raise CorruptDataError(f"key {key.decode()}: LMDB cannot read it ({e})") from None
            if value is None:
                raise CorruptDataError(f"key {key.decode()}: missing from the LMDB environment")
            if np.frombuffer(value, np.uint8).ctypes.data + len(value) > self._end:  # would fault (SIGBUS)
                raise CorruptDataError(f"key {key.decode()}: its {len(value):,} bytes run past the end of the file")
            header, data = parse(value, f"key {key.decode()}")
            self._check_kind(header, key)
        except CorruptDataError as e:
            raise CorruptDataError(f"{self.where(i)}, {DATA} {e}") from None
        return (header, data, value) if whole else (header, data)

    def _check_kind(self, header: Header, key: bytes) -> None:
        shape = self.stored_shape
        ok = header.kind == "raw" and (header.height, header.width) == shape[:2] if shape else header.kind != "raw"
        if not ok:
            raise CorruptDataError(f"key {key.decode()}: a {header.height}x{header.width} {header.kind} record "
                                   f"in a {self.store} dataset of shape {shape}")
