"""A pixfeed dataset as a pack's source: repack it in another format, store mode or size.

``pixfeed pack OLD NEW --format wds`` where OLD holds ``pixfeed.json``: its
records, keys, labels, classes and fields are carried over, in OLD's store
(and pixel size) unless ``--store`` (``--size``) says otherwise, every checksum
checked on the way in (``read_checked``, ``read_fields``).  Encoded records
go to the new pack as the bytes they are; stored pixels (and pixels-mode masks
and second images) as lossless PNGs, so a repack to pixels resizes what OLD
stored.  Images are read in the pack's tasks, a task's slice at a time; the
fields are read once, by the driver.  The manifest's ``source`` names OLD.
A WebDataset dataset is read by place: its shards' headers are walked once (a
shard per job on the local executor's workers) for labels, fields and where
each image member lies, and each task reads its own images there.  Repacking a
dataset onto itself is refused.
"""
from __future__ import annotations

import os
from typing import Callable, Iterator, Tuple

import numpy as np

from ..image.decode import pixel_limit
from ..errors import CorruptDataError, OptionError
from ..fields import array, picture
from ..fields.codec import decode
from ..manifest import MANIFEST_NAME, read_manifest
from ..sources import Source
from ..storage.store import is_url, local_path
from .options import STORE_ONLY
from .records import Verified

BLOCK = 256  # records read at once by a task


def is_dataset(src) -> bool:
    """Whether ``src`` is a local pixfeed dataset (a folder holding the manifest)."""
    return not is_url(src) and (local_path(src) / MANIFEST_NAME).is_file()


class DatasetSource(Source):
    """The records of a packed dataset, read through its reader."""
    dataset = None

    def where(self, i: int) -> str:
        return self.dataset.where(i)

    def field_where(self, i: int, name: str) -> str:
        return f"{self.dataset.where(i)}, field {name}"

    def fetch(self, indices) -> Iterator[Tuple[int, object]]:
        indices = [int(i) for i in indices]
        if self.dataset.format == "wds":  # each image read at its place in its shard (found by the scan)
            yield from self._records(self.dataset.read_places((i, *self.places[i]) for i in indices))
            return
        yield from self._records(self.dataset.iter_verified(indices, BLOCK))

    def _records(self, read) -> Iterator[Tuple[int, object]]:
        """Checked encoded records as the reader holds them (maybe a view of data.bin, or of LMDB's map in
        a read transaction: no copy; a task writes each before it asks for the next), with their
        checksum; stored pixels as PNGs."""
        verified = self.dataset.store == "encoded" and self.dataset.checksums
        for i, stored, checksum in read:
            yield int(i), Verified(memoryview(stored), int(checksum)) if verified else \
                _encoded(stored, self.dataset.store)


def _encoded(stored, store: str) -> bytes:
    """Encoded records as they are; stored pixels as a PNG (lossless)."""
    return bytes(stored) if store == "encoded" else picture.encode_png(np.asarray(stored))


def kept_store(src, options: dict) -> dict:
    """Pack options for a repack of ``src``: without ``store`` or an option of one store (``size``,
    ``max_side``, ...), the source's store is kept (for stored pixels, with its pixel size), whatever
    the new format's default."""
    if options.get("store") is not None or any(options.get(k) not in (None, False) for k in STORE_ONLY):
        return options
    manifest = read_manifest(local_path(src))
    kept = {"store": manifest["store"]}
    if manifest["store"] == "pixels" and options.get("size") is None and manifest.get("shape"):
        kept["size"] = "{}x{}".format(*manifest["shape"][:2])
    return {**options, **kept}


def scan_dataset(src, dst, map_fn: Callable = map, allow_links: bool = False) -> DatasetSource:
    """The source of a repack of ``src``; a wds dataset's shards are walked a shard per ``map_fn`` job
    (a pack's local workers: ``Executor.map``; ``_wds_labels_values``)."""
    from ..datasets import open_dataset

    root = local_path(src)
    if not is_url(dst) and local_path(dst).resolve() == root.resolve():
        raise OptionError(f"destination {dst} is the source dataset itself; repack to another DST")
    ds = open_dataset(root, fields=None, allow_links=allow_links)
    n, names = len(ds), [f.name for f in ds.schema]
    keys = ds.keys()
    places = None
    if ds.format == "wds":
        labels, values, places = _wds_labels_values(ds, names, map_fn)
        sizes = places[:, 2].astype(np.int64)
    else:
        (labels, values), sizes = _labels_values(ds, names, n), _sizes(ds, n)
    source = DatasetSource(root, keys, keys, labels.astype(np.int64), ds.classes, sizes)
    source.dataset, source.schema, source.per_box, source.places = ds, ds.schema, ds.per_box, places
    source.checked = True  # checked when first packed: a JPEG record's header is enough (records.load_record)
    options = ds.manifest.get("options") or {}
    source.checked_limit = pixel_limit(options["max_pixels"]) if "max_pixels" in options else -1
    source.values = values
    source.origin = {"kind": "pixfeed", "path": str(root), "format": ds.format, "store": ds.store}
    return source


def _sizes(ds, n: int) -> np.ndarray:
    """What each record will take in the new pack, for writers that place records ahead (encoded
    records are repacked as they are): from the reader's record extents, exact for mmap (data.bin
    spans), an upper bound for LMDB (its values add a header and a field table) and HDF5 (a heap
    collection), so a repack from those leaves gaps for the writer to close; else the mean stored
    bytes."""
    extents = ds.record_extents() if ds.store == "encoded" and hasattr(ds, "record_extents") else None
    if extents is not None and extents.lengths is not None:
        with ds.open_local(os.path.relpath(extents.path, ds.path)) as f:  # the file read, not a link swapped in
            return _within(extents, os.fstat(f.fileno()).st_size)
    stored = sum(meta["bytes"] for meta in ds.manifest["files"].values())
    return np.full(n, stored // max(n, 1), np.int64)


def _within(extents, size: int) -> np.ndarray:
    """The record lengths of ``extents``, each record checked to lie within its data file's ``size`` bytes
    (of the file opened, not a link swapped in): they size the new pack's file and the disk it reserves,
    and a dataset's offsets are input (100 GiB claimed for a 1 KB data.bin reserved 100 GiB).
    CorruptDataError naming the first record that does not."""
    starts, lengths = np.asarray(extents.starts, np.int64), np.asarray(extents.lengths, np.int64)
    bad = np.flatnonzero((starts < 0) | (lengths < 0) | (starts > size) | (lengths > size - starts))
    if len(bad):
        i = int(bad[0])
        raise CorruptDataError(f"{extents.path}: record {i} lies at bytes {int(starts[i]):,}..+{int(lengths[i]):,} "
                               f"by the dataset's offsets, outside the file's {size:,} bytes; the dataset is "
                               "damaged (run 'pixfeed verify')")
    return lengths


def _labels_values(ds, names, n: int) -> tuple:
    """Every label, and every field's value per record as an index source holds them (pictures as file
    bytes), read a block of records at a time."""
    labels = [ds.read_labels(np.arange(s, min(s + BLOCK, n))) for s in range(0, n, BLOCK)]
    raws = (raw for s in range(0, n, BLOCK) for raw in ds.read_fields(np.arange(s, min(s + BLOCK, n)), names))
    return np.concatenate(labels) if n else np.zeros(0, np.int64), _values(ds, names, raws)


def _wds_labels_values(ds, names, map_fn: Callable) -> tuple:
    """The same from a wds dataset, and where each image member lies (N x (shard, offset, size,
    xxh3_64), for ``read_places``): one walk of its shards' headers, the images left to the tasks.
    The shards are walked a shard per ``map_fn`` job (10,000 samples: 0.6 s of headers and metadata
    in one process)."""
    starts = np.cumsum([0] + [shard["count"] for shard in ds.shards]).tolist()

    def walk(shard: int) -> list:
        read = ds.read_range(starts[shard], starts[shard + 1], fields=True, images=False)
        return [(place, label, {name: bytes(raw[name]) for name in names}) for _, place, label, raw in read]

    rows = [row for walked in map_fn(walk, range(len(ds.shards))) for row in walked]
    places = np.array([place for place, _, _ in rows], np.uint64).reshape(-1, 4)
    labels = np.asarray([label for _, label, _ in rows], np.int64)
    return labels, _values(ds, names, (raw for _, _, raw in rows)), places


def _values(ds, names, raws) -> dict:
    if not names:  # nothing to read: a dataset without fields
        return {}
    values = {name: [] for name in names}
    by_name = {f.name: f for f in ds.schema}
    for raw in raws:
        for name in names:
            values[name].append(_value(by_name[name], raw[name], ds))
    return values


def _value(f, data, ds):
    if f.type in ("mask", "image"):
        if ds.store == "encoded":
            return bytes(data)
        shape = ds.stored_shape if f.type == "image" else ds.stored_shape[:2]
        return picture.encode_png(np.frombuffer(data, np.uint8).reshape(shape)) if f.type == "image" else \
            picture.encode_mask(np.frombuffer(data, np.uint8).reshape(shape))
    if f.type in ("ndarray", "boxes"):
        return array.decode(f, data).copy()
    return decode(f, data)


