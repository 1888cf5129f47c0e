"""Reader of the HDF5 format (layout: pixfeed.layouts.hdf5)."""
from __future__ import annotations

import functools
import os
from typing import Optional

import numpy as np

from ..image import buffers as batchbuffers
from ..errors import CorruptDataError, OutsideDatasetError, PixfeedError
from ..layouts import hdf5 as layout
from ..storage import extentfile
from ..storage.paths import LINKS_OPTION, open_inside, opened_path
from ..storage.pagecache import Extents
from .base import MapImageDataset


def _damage_named(read):
    """``read`` (a reader's method of ``indices``) with h5py's plain OSError on damaged bytes (a chunk that
    does not decompress, a broken index) a CorruptDataError naming the file and the first record."""
    @functools.wraps(read)
    def named(self, indices, *args, **kwargs):
        try:
            return read(self, indices, *args, **kwargs)
        except PixfeedError:
            raise
        except Exception as e:  # noqa: BLE001 - h5py's OSError, RuntimeError... on damaged bytes
            first = int(np.min(indices)) if len(indices) else 0
            raise CorruptDataError(f"{self.where(first)}{' and the rest of its batch' if len(indices) > 1 else ''}, "
                                   f"{layout.DATA}: HDF5 cannot read it ({e}); the file is damaged") from None
    return named


class H5ImageDataset(MapImageDataset):
    """``H5ImageDataset(path, transform=None, *, size=None, crop="center", crop_ratio=None,
    checksums=True, exact=False)``.

    The file is opened read-only on first access in each process (an HDF5
    handle is never used across a fork).  A dense batch (its indices span at
    most twice its size) is one slice read; a sparse one reads row by row,
    since h5py's fancy selection is ~40x slower than that on chunked data.
    Rows of uncompressed pixels (one image per chunk, no filters) are read as
    raw chunks straight into the batch, about twice as fast as ``images[i]``.

    Read-ahead (``record_extents``): a pixels record is its chunk (HDF5's chunk
    index gives its file offset and size); an encoded record lives in HDF5's
    global heap, and its unfiltered reference (length, heap collection address,
    object index) gives the collection's address: the extent is that collection,
    sized to hold the records that share it.  The packer writes every record's
    extent to ``extents.npy``; packs made before it have them looked up.
    """
    format = "hdf5"

    @property
    def _records_name(self) -> str:
        """The HDF5 dataset holding the records (pixels or encoded bytes)."""
        return layout.IMAGES if self.store == "pixels" else layout.ENCODED

    def _file(self):
        """``data.h5`` open read-only in h5py: through the chunk cache, or the local file ``open_inside`` opened
        (no link followed, even one swapped in after open_dataset's scan, unless ``allow_links``), which HDF5
        opens again as ``/proc/self/fd/N`` (``opened_path``): the very file checked, read by HDF5's own
        driver (h5py's Python file-object driver would put a Python call in every read)."""
        import h5py

        if self.chunks is not None:
            return h5py.File(self.data_file(layout.DATA), "r")
        fd = open_inside(self.path, layout.DATA, self.allow_links)
        try:
            return h5py.File(opened_path(fd, self.path / layout.DATA), "r")
        finally:
            os.close(fd)

    def _open(self) -> dict:
        where = f"{self.path}/{layout.DATA}"
        try:
            f = self._file()
        except OSError as e:  # h5py's plain OSError for a file HDF5 cannot read
            raise CorruptDataError(f"{where}: HDF5 cannot open it ({e}); the file is damaged") from None
        try:
            if not self.allow_links:
                check_contained(f, where)
            out = {key: _array(f, name, where) for key, name in
                   (("data", self._records_name), ("labels", layout.LABELS), ("checksums", layout.CHECKSUMS))}
            tail = tuple(self.manifest["shape"]) if self.store == "pixels" else ()
            for key, rows, kind in (("data", tail, "uint8" if tail else "bytes"), ("labels", (), "int64"),
                                    ("checksums", (), "int64")):
                check_array(out[key], self.manifest["count"], rows, kind, where)
        except PixfeedError:
            f.close()
            raise
        except Exception as e:  # noqa: BLE001 - h5py's RuntimeError, KeyError, OSError... on damaged structures
            f.close()
            raise CorruptDataError(f"{where}: HDF5 cannot read its structure ({type(e).__name__}: {e}); the file is "
                                   "damaged") from None
        except BaseException:
            f.close()
            raise
        data = out["data"]
        out["raw_chunks"] = self.store == "pixels" and data.chunks == (1, *data.shape[1:]) \
            and data.id.get_create_plist().get_nfilters() == 0
        return out

    @_damage_named
    def read_stored(self, indices: np.ndarray):
        """Pixels mode: one N x H x W x 3 array; encoded mode: a list of uint8 arrays."""
        h = self.handle
        lo, hi = int(indices.min()), int(indices.max()) + 1
        if hi - lo <= 2 * len(indices):
            span, pick = slice(lo, hi), indices - lo
            stored, labels, checksums = (h[name][span][pick] for name in ("data", "labels", "checksums"))
            return stored if self.store == "pixels" else list(stored), labels, checksums
        rows, order = np.unique(indices, return_inverse=True)
        return self._rows(indices), h["labels"][rows][order], h["checksums"][rows][order]

    @_damage_named
    def read_labels(self, indices: np.ndarray) -> np.ndarray:
        rows, order = np.unique(indices, return_inverse=True)
        return self.handle["labels"][rows][order]

    @_damage_named
    def read_fields(self, indices: np.ndarray, names) -> list:
        rows, order = np.unique(indices, return_inverse=True)
        out = [{} for _ in indices]
        f = self.handle["data"].file
        for name in names:
            data = f[f"{layout.FIELDS}/{name}"][rows][order]
            sums = f[f"{layout.FIELD_CHECKSUMS}/{name}"][rows][order]
            for j, i in enumerate(indices):
                rec = data[j] if isinstance(data[j], bytes) else np.ascontiguousarray(data[j])
                self.check_field(name, rec, sums[j], int(i))
                out[j][name] = rec
        return out

    def _rows(self, indices: np.ndarray):
        """Scattered records: pixels one at a time into one N x H x W x 3 array; encoded as a list, read in
        one selection of the distinct rows in order (2-3x faster than a read a record)."""
        data = self.handle["data"]
        if self.store != "pixels":
            rows, order = np.unique(indices, return_inverse=True)
            stored = data[rows]
            return [stored[k] for k in order]
        out = batchbuffers.empty((len(indices), *data.shape[1:]))
        if self.handle["raw_chunks"]:
            flat = out.reshape(len(indices), -1)
            for j, i in enumerate(indices):
                data.id.read_direct_chunk((int(i), 0, 0, 0), out=flat[j])
        else:
            for j, i in enumerate(indices):
                out[j] = data[i]
        return out

    def record_extents(self) -> Optional[Extents]:
        """Where each record's stored bytes lie in ``data.h5``: from the pack's ``extents.npy`` (memory-mapped,
        nothing per record kept, no chunk index read), or, in a pack made before it, looked up in the chunk
        index as read-ahead needs them; None when the layout hides it."""
        listed = extentfile.listed(self, layout.DATA, layout.EXTENTS)
        if listed is not None:
            return self.lazy_extents(layout.DATA, listed)
        data = self.handle["data"]  # this process's own handle (checked as it opened): data.h5 opened once
        if data.chunks is None or data.id.get_create_plist().get_nfilters():
            return None
        return self.lazy_extents(layout.DATA, self._record_ranges)

    def _record_ranges(self, records: np.ndarray) -> tuple:
        """(starts, lengths) of ``records``, looked up for a window of the order at a time: a pixels
        record is its chunk; an encoded one its heap collection, read from the chunks of references that
        hold the records (a collection also holding records of a neighbouring chunk is undersized: a
        shorter hint, never a wrong read)."""
        records = np.asarray(records, np.int64)
        # this process's own handle (data.h5 is opened once a process; h5py serialises the lookup threads)
        data = self.handle["data"]
        if self.store == "pixels":
            zeros = (0,) * (len(data.shape) - 1)
            info = [data.id.get_chunk_info_by_coord((i, *zeros)) for i in records.tolist()]
            return np.array([c.byte_offset for c in info], np.int64), np.array([c.size for c in info], np.int64)
        per = data.chunks[0]
        firsts = np.unique(records // per)
        refs = b"".join(data.id.read_direct_chunk((int(first) * per,))[1] for first in firsts)
        starts, sizes = _heap_extents(refs, len(refs) // _VLEN_REF.itemsize)
        at = np.searchsorted(firsts, records // per) * per + records % per
        return starts[at], sizes[at]


CHUNK_BYTES = 64 << 20  # one HDF5 chunk beyond one record (HDF5 reads and decompresses a whole chunk)


def _array(f, name: str, where: str):
    """The HDF5 dataset ``name`` of the open file ``f``; missing, or not a dataset, a CorruptDataError."""
    import h5py

    obj = f.get(name)
    if not isinstance(obj, h5py.Dataset):
        raise CorruptDataError(f"{where}: no {name!r} dataset; the file is damaged or not a pixfeed dataset")
    return obj


def check_array(data, count: int, row: tuple, kind: str, where: str) -> None:
    """Check the HDF5 dataset ``data`` before reading it, against what the manifest says it holds: ``count``
    rows of shape ``row`` of ``kind`` ("uint8", "int64": any 64-bit integer, "bytes": variable-length
    uint8), in chunks no larger than one row or CHUNK_BYTES (HDF5 allocates a whole chunk to read one row
    of it: a chunk of 30000 x 30000 pixels in a 7 KB file took 2.5 GB to read one 8 x 8 record).
    CorruptDataError naming the dataset."""
    import h5py

    name = data.name.lstrip("/")
    if data.shape != (count, *row):
        raise CorruptDataError(f"{where}: {name} has shape {data.shape}, but the manifest says {count:,} records"
                               + (f" of {list(row)}" if row else "") + "; the dataset is damaged")
    vlen = h5py.check_vlen_dtype(data.dtype)
    if not (vlen == np.uint8 if kind == "bytes" else vlen is None and (
            data.dtype == np.uint8 if kind == "uint8" else data.dtype.kind in "iu" and data.dtype.itemsize == 8)):
        raise CorruptDataError(f"{where}: {name} holds {f'variable-length {vlen}' if vlen is not None else data.dtype}"
                               f", not the {kind} pixfeed stores there; the dataset is damaged")
    if data.chunks is not None:
        one = int(np.prod(row, dtype=np.int64)) * data.dtype.itemsize
        chunk = int(np.prod(data.chunks, dtype=np.int64)) * data.dtype.itemsize
        if chunk > max(one, CHUNK_BYTES):
            raise CorruptDataError(f"{where}: {name} is stored in chunks of {data.chunks} ({chunk:,} bytes), over "
                                   f"pixfeed's limit of {max(one, CHUNK_BYTES) >> 20} MiB for one chunk; the "
                                   "dataset is damaged or made to exhaust memory")


def check_contained(f, where: str) -> None:
    """Raise OutsideDatasetError if the open HDF5 file ``f`` reads any other file: an external link, a
    dataset with external storage, a virtual dataset (pixfeed writes none; ``allow_links`` accepts them)."""
    import h5py

    def dataset(name: str, obj) -> Optional[str]:  # a visitor: the first non-None return ends the visit
        if isinstance(obj, h5py.Dataset) and obj.external:
            return f"/{name} keeps its data in external files ({', '.join(repr(e[0]) for e in obj.external)})"
        if isinstance(obj, h5py.Dataset) and obj.is_virtual:
            return f"/{name} is a virtual dataset mapping other files"
        return None

    def link(name: str, value) -> Optional[str]:
        return f"/{name} is an external link to {value.filename!r}" if isinstance(value, h5py.ExternalLink) else None

    if hasattr(f, "visit_links"):  # h5py >= 3.11: every link once, none followed
        found = f.visit_links(lambda name: link(name, f.get(name, getlink=True)))
    else:
        groups = [f]
        f.visititems(lambda name, obj: groups.append(obj) if isinstance(obj, h5py.Group) else None)
        found = next((why for g in groups for name in g
                      if (why := link(f"{g.name.strip('/')}/{name}".lstrip("/"), g.get(name, getlink=True)))), None)
    found = found or f.visititems(dataset)
    if found:
        raise OutsideDatasetError(f"{where}: {found}, outside the dataset; a dataset reads only its own files: pass "
                                  f"{LINKS_OPTION} if you trust it")


def every_extent(data) -> Optional[tuple]:
    """(starts, lengths) of every record of the HDF5 dataset ``data`` (pixels or encoded records) in one walk
    of its chunk index, as ``_record_ranges`` finds those of a few: for the packer's ``extents.npy``, from the
    writer's own handle once every record is in place.  None where HDF5 does not store the records as they are
    read (contiguous, filtered)."""
    if data.chunks is None or data.id.get_create_plist().get_nfilters():
        return None
    n, per = data.shape[0], data.chunks[0]
    if data.ndim == 1:  # variable-length references: the records live in heap collections
        refs = b"".join(data.id.read_direct_chunk((first,))[1] for first in range(0, n, per))
        return _heap_extents(refs, n)
    chunks = -(-n // per)
    starts, sizes = np.zeros(chunks, np.int64), np.zeros(chunks, np.int64)

    def chunk(info) -> None:  # chunk_iter's visitor (HDF5 walks its index once: ~1 us a chunk, where a lookup
        # by coordinate took ~540 us a chunk of 50,000)
        starts[info.chunk_offset[0] // per], sizes[info.chunk_offset[0] // per] = info.byte_offset, info.size

    if hasattr(data.id, "chunk_iter"):
        data.id.chunk_iter(chunk)
    else:  # h5py built on HDF5 before 1.12.3 (h5py 3.8's wheels): a call a chunk
        for k in range(data.id.get_num_chunks()):
            chunk(data.id.get_chunk_info(k))
    which = np.arange(n) // per
    return starts[which], sizes[which]


_VLEN_REF = np.dtype([("length", "<u4"), ("collection", "<u8"), ("index", "<u4")])


def _heap_extents(refs: bytes, n: int) -> tuple:
    """Extents of vlen records: each record's heap collection, sized for all the objects it holds
    (16-byte collection header, then a 16-byte header and the data padded to 8 bytes per object)."""
    ref = np.frombuffer(refs, _VLEN_REF, count=n)
    starts = ref["collection"].astype(np.int64)
    objects = 16 + (ref["length"].astype(np.int64) + 7) // 8 * 8
    collections, which = np.unique(starts, return_inverse=True)
    sizes = 16 + np.bincount(which, weights=objects).astype(np.int64)
    return starts, sizes[which]
