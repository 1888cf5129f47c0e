"""Reader of the memory-mapped format (layout: pixfeed.layouts.mmap).

Two ways to read a record, chosen when a process opens the dataset
(``pixfeed.machine.memory.fits_in_page_cache`` of its files):

* the dataset fits in the page cache this process may keep: out of a memory
  map, one copy per record (8 GB/s warm for 256x256 records here, against
  3 GB/s for ``pread``, which pays a page-cache lookup per 4 KiB page);
* it does not: ``pread`` into the destination (a row of the batch, or a bytes
  object for an encoded image).  The pages stay in the page cache without
  being mapped into the process, so its RSS stays flat however much of the
  dataset it reads, and the kernel reclaims them without unmapping anything.

Mapped pixels are gathered in one ``numpy.take`` per batch and then hashed
record by record (224x224 batches of 64, warm, one core: 76k images/s with
checksums against 65k copying and hashing record by record, whose Python per
record cost more than reading the batch from the CPU's cache twice); read
records are hashed right after each read.
Labels, checksums and offsets (16-24 bytes a record) are memory-mapped.
"""
from __future__ import annotations

import functools

import numpy as np

from ..image import buffers as batchbuffers
from ..checksum import record_hash
from ..storage.bounded import IMAGE_BYTES
from ..storage.chunkfile import npy_layout, read_at, readinto_at
from ..errors import CorruptDataError, PixfeedError
from ..layouts import mmap as layout
from ..machine.memory import fits_in_page_cache
from ..storage.pagecache import Extents
from ..storage.paths import map_inside
from .base import MapImageDataset


class MmapImageDataset(MapImageDataset):
    """``MmapImageDataset(path, transform=None, *, size=None, crop="center", crop_ratio=None,
    checksums=True, exact=False)``.

    A batch of indices is one pass over its records, copied into one batch
    array (pixels mode) or sliced or read as bytes (encoded mode).
    """
    format = "mmap"
    checks_data_file = True  # records by their checksums, the .npy header's shape against the manifest

    def _open(self) -> dict:
        n = self.manifest["count"]
        arrays = {"labels": self._load(layout.LABELS, (n,)).view(np.ndarray),  # plain views: no memmap per batch
                  "checksums": self._load(layout.CHECKSUMS, (n,)).view(np.ndarray)}
        name = layout.IMAGES if self.store == "pixels" else layout.DATA
        if self.store == "encoded":
            arrays["offsets"] = self._load(layout.OFFSETS, (n + 1,))
        if self.chunks is not None:
            arrays["file"] = self.data_file(name)
            arrays["base"] = self._checked_header(arrays["file"]) if self.store == "pixels" else 0
        elif fits_in_page_cache(sum(meta["bytes"] for meta in self.manifest["files"].values())):
            mapped = self._load(name, (n, *self.stored_shape), "u1") if self.store == "pixels" else \
                map_inside(self.path, name, self.allow_links, npy=False)
            arrays["map"] = mapped.view(np.ndarray)  # slices of a memmap cost 11 us each in its __array_finalize__
        else:
            arrays["file"] = self.open_local(name)
            arrays["base"] = self._load(name, (n, *self.stored_shape), "u1").offset if self.store == "pixels" else 0
        return arrays

    def _load(self, name: str, shape: tuple = None, dtype: str = "i8"):
        """``name`` memory-mapped, checked to hold ``shape`` (when given) of ``dtype`` ("i8": any 64-bit integer,
        "u1": uint8) before any is read: a .npy of another length, rank or type (or no .npy at all) is a
        CorruptDataError naming it, not an IndexError or a silent cast later."""
        path = self.path / name
        try:
            array = map_inside(self.path, name, self.allow_links)  # the file checked is the file mapped
        except PixfeedError:  # a link (OutsideDatasetError), a special file: named already
            raise
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - not a .npy, a pickle, too short, a header that does not parse
            # (numpy's parse of the header's text raises SyntaxError or tokenize's TokenError on some bytes)
            raise CorruptDataError(f"{path}: not a NumPy array file pixfeed can read ({e}); the dataset is "
                                   "damaged") from None
        fits = array.dtype == np.uint8 if dtype == "u1" else array.dtype.kind in "iu" and array.dtype.itemsize == 8
        if shape is not None and (array.shape != shape or not fits):
            rows = array.shape[0] if array.ndim else 0
            raise CorruptDataError(f"{path}: holds {rows:,} records ({array.dtype}, shape {array.shape}), but the "
                                   f"manifest's count is {self.manifest['count']:,} (so {shape} of "
                                   f"{'uint8' if dtype == 'u1' else '64-bit integers'}); the dataset is damaged "
                                   "(pixfeed verify names more)")
        return array

    def _checked_header(self, file) -> int:
        """The records' offset in ``images.npy`` read through chunks, its shape checked against the manifest
        (chunks of a size the manifest lists no hashes for are not checked by the cache: docs/buckets.md)."""
        try:
            try:
                shape, offset = npy_layout(file)
                if tuple(shape) != (self.manifest["count"], *self.stored_shape):
                    raise ValueError(f"shape {tuple(shape)}")
            except ValueError:
                if self.chunks.part:
                    raise
                self.chunks.drop(0, 4096)  # fetched once more, as a chunk failing its hash
                try:
                    shape, offset = npy_layout(file)
                except ValueError:
                    self.chunks.drop(0, 4096)  # damaged bytes are not kept
                    raise
        except ValueError as e:
            raise CorruptDataError(f"{self.path}/{layout.IMAGES}: its header does not parse ({e}); the data file is "
                                   f"damaged (run 'pixfeed verify')") from None
        if tuple(shape) != (self.manifest["count"], *self.stored_shape):
            raise CorruptDataError(f"{self.path}/{layout.IMAGES}: its header gives shape {tuple(shape)}, but the "
                                   f"manifest records {self.manifest['count']:,} records of {self.stored_shape}; the "
                                   f"data file is damaged (run 'pixfeed verify')")
        return offset

    reads_into = True

    def read_checked(self, indices, out=None, crop=None):
        idx = self._indices(indices)
        stored, labels, _ = self.read_stored(idx, check=self.checksums, out=out, crop=crop)
        return idx, stored, labels

    def read_into(self, indices, out: np.ndarray) -> np.ndarray:
        """The base class's ``read_into`` in as few steps as a batch allows: stored pixels only."""
        if self.store != "pixels" or self.cpu_bound:
            return super().read_into(indices, out)
        idx, h = self._indices(indices), self.handle
        self._read_rows(h, idx, h["checksums"][idx], self.checksums, out, self._crop)
        return h["labels"][idx]

    @functools.cached_property
    def _crop(self):
        return self._slice_crop()

    def read_stored(self, indices: np.ndarray, check: bool = False, out=None, crop=None):
        """(records, labels, checksums); with ``check``, each record is hashed (CorruptDataError on a
        mismatch).  Stored pixels are read into ``out`` when given: N x H x W x 3, the stored shape, or with
        ``crop`` (rows, columns: slices of a stored image) the crop's shape, each record's crop written there."""
        h = self.handle
        checksums = h["checksums"][indices]
        if self.store == "pixels":
            shape = self.stored_shape if crop is None else _sliced(self.stored_shape, crop)
            stored = batchbuffers.empty((len(indices), *shape)) if out is None else out
            self._read_rows(h, indices, checksums, check, stored, crop)
        else:
            stored = [self._checked_read(h, int(i), lambda i=int(i): self._record(h, i), check, checksums[j])
                      for j, i in enumerate(indices)]
        return stored, h["labels"][indices], checksums

    def _read_rows(self, h: dict, indices: np.ndarray, checksums: np.ndarray, check: bool, out: np.ndarray,
                   crop=None) -> None:
        """Stored pixels of ``indices`` into ``out`` (their ``crop``, when given) in one pass over each record:
        it is copied into ``out``'s row, or for a crop into one scratch row that stays in the CPU's cache,
        hashed there, and its crop copied out.  What is hashed is this process's copy, so the pixels returned
        are the ones checked even if the file changed under the map.  (64 records of 256x256, warm, one core:
        1.9 ms to crop at 224, against 2.5-3.2 ms gathering the batch, hashing it and then copying its crops:
        the gathered batch left the cache before it was read again.)"""
        whole = crop is None or out.shape[1:] == self.stored_shape
        scratch = None if whole or (not check and "map" in h) else batchbuffers.empty((1, *self.stored_shape))[0]
        mapped = h.get("map")
        for j, i in enumerate(indices.tolist()):
            if mapped is not None and not check and not whole:  # nothing to hash: the crop copied straight
                np.copyto(out[j], mapped[i][crop])
                continue
            row = out[j] if whole else scratch
            if mapped is not None:
                np.copyto(row, mapped[i])
                self._check(check, row, checksums[j], i)
            else:
                self._checked_read(h, i, lambda i=i, row=row: (self._copy_row(h, i, row), row)[1], check,
                                   checksums[j])
            if not whole:
                np.copyto(out[j], row[crop])

    def read_labels(self, indices: np.ndarray) -> np.ndarray:
        return self.handle["labels"][indices]

    def read_fields(self, indices: np.ndarray, names) -> list:
        out = [{} for _ in indices]
        for name in names:
            data, offsets, sums = self._field(name)
            for j, i in enumerate(indices):
                rec = data[i:i + 1] if offsets is None else data[offsets[i]:offsets[i + 1]]
                self.check_field(name, rec, sums[i], int(i))
                out[j][name] = rec
        return out

    def _field(self, name: str) -> tuple:
        """(rows or bytes, offsets or None, checksums) of field ``name``, mapped once per process."""
        cache = self.handle.setdefault("fields", {})
        if name not in cache:
            path = lambda part: self.path / layout.field_file(name, part)  # noqa: E731
            load = lambda part, npy=True: map_inside(self.path, layout.field_file(name, part),  # noqa: E731
                                                     self.allow_links, npy)
            if path("npy").is_file():
                cache[name] = load("npy"), None, load("checksums")
            else:
                cache[name] = load("bin", False).view(np.ndarray), load("offsets"), load("checksums")
        return cache[name]

    def _checked_read(self, h: dict, i: int, read, check: bool, expected):
        """``read()``, checked; through chunks the cache did not check (another chunk size), a record failing its
        checksum has its chunks fetched once more before CorruptDataError."""
        record = read()
        if check and self.chunks is not None and not self.chunks.part and record_hash(record) != int(expected):
            if self.store == "pixels":
                row = int(np.prod(self.stored_shape))
                self.chunks.drop(h["base"] + i * row, h["base"] + (i + 1) * row)
            else:
                self.chunks.drop(int(h["offsets"][i]), int(h["offsets"][i + 1]))
            record = read()
            if record_hash(record) != int(expected):
                self.chunks.drop(*((h["base"] + i * row, h["base"] + (i + 1) * row) if self.store == "pixels" else
                                   (int(h["offsets"][i]), int(h["offsets"][i + 1]))))  # damaged bytes are not kept
        self._check(check, record, expected, i)
        return record

    def _copy_row(self, h: dict, i: int, out: np.ndarray) -> None:
        if readinto_at(h["file"], out, h["base"] + i * out.nbytes) != out.nbytes:
            raise self._short(i)

    def _record(self, h: dict, i: int):
        start, end = int(h["offsets"][i]), int(h["offsets"][i + 1])
        if not 0 <= start <= end <= start + IMAGE_BYTES:  # read_at would allocate end - start, or fail
            raise CorruptDataError(f"{self.where(i)}: {layout.OFFSETS} gives it bytes {start:,} to {end:,} of "
                                   f"{layout.DATA}; the dataset is damaged (run 'pixfeed verify {self.path}')")
        if "map" in h:
            return h["map"][start:end]
        data = read_at(h["file"], end - start, start)
        if len(data) != end - start:
            raise self._short(i)
        return data

    def _check(self, check: bool, record, expected, i: int) -> None:
        if check and record_hash(record) != int(expected):
            self.check_checksum(record, expected, i)  # raises, naming the record

    def _short(self, i: int) -> CorruptDataError:
        return CorruptDataError(f"{self.where(i)}: the data file ends inside the record (truncated); "
                                f"run 'pixfeed verify {self.path}'")

    def record_extents(self) -> Extents:
        """Where each record's stored bytes lie in its data file (for read-ahead hints)."""
        meta = [self.path / name for name in (layout.LABELS, layout.CHECKSUMS)]
        if self.store == "pixels":
            if self.chunks is not None:  # checked against the manifest (chunks may be unchecked by the cache)
                shape = (self.manifest["count"], *self.stored_shape)
                offset = self._checked_header(self.data_file(layout.IMAGES))
            else:
                with self.open_local(layout.IMAGES) as f:
                    shape, offset = npy_layout(f)
            row = int(np.prod(shape[1:]))

            def rows(records: np.ndarray) -> tuple:  # arithmetic: nothing per record kept
                starts = offset + row * records.astype(np.int64)
                return starts, np.full(len(starts), row, np.int64)
            return Extents(self.path / layout.IMAGES, whole=meta, ranges=rows, count=shape[0],
                           mean_length=float(row))
        return self.lazy_extents(layout.DATA, OffsetRanges(self.path, layout.OFFSETS, self.allow_links),
                                 [*meta, self.path / layout.OFFSETS])


def _sliced(shape: tuple, crop) -> tuple:
    """The shape of ``crop`` (rows, columns) of an image of ``shape`` (H, W, 3)."""
    rows, cols = crop
    return (len(range(*rows.indices(shape[0]))), len(range(*cols.indices(shape[1]))), *shape[2:])


class OffsetRanges:
    """(starts, lengths) of records from the memory-mapped ``offsets.npy`` (mapped when first asked:
    shared pages, nothing per record copied)."""

    def __init__(self, root, name: str, allow_links: bool = False) -> None:
        self.where, self.offsets = (root, name, allow_links), None

    def __call__(self, records: np.ndarray) -> tuple:
        if self.offsets is None:
            offsets = map_inside(*self.where)
            self.offsets = offsets.view(np.int64) if offsets.dtype == np.uint64 else offsets
        records = np.asarray(records, np.int64)
        starts = self.offsets[records].astype(np.int64)
        return starts, self.offsets[records + 1].astype(np.int64) - starts
