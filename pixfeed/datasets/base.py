"""What every pixfeed dataset shares: the manifest-only constructor, lazy
per-process handles, checksum checks on read, and turning stored records into
``(image, label)``.

* ``path`` may be a URL (``s3://...``; ``storage_options=`` as in
  pixfeed.storage.store): formats with ``streams`` (wds) read it directly; the
  others are first copied to the local cache (pixfeed.storage.cache: ``cache_dir=``,
  ``cache_limit=``) and ``path`` is that copy, except mmap and HDF5 datasets
  larger than ``cache_limit``: their data file is read through a bounded
  chunk cache (pixfeed.storage.chunked: ``chunk_bytes=``, ``storage_timeout=``).
* Constructing a dataset reads only ``pixfeed.json``.  Data files are opened
  on first access in each process (the owning pid is kept beside the handle),
  and ``__getstate__`` drops the handle, so datasets pickle and fork safely.
* Every record's stored bytes are checked against their xxh3_64 checksum
  before use (``checksums=False`` skips it; ``verify=`` is its deprecated
  name, which read like the ``pixfeed verify`` command); a mismatch raises
  CorruptDataError naming the dataset, record index and key.
* Map-style formats implement ``_open`` (the process's handle) and
  ``read_stored`` (stored records, labels and checksums of a batch of
  indices); ``read_checked`` is that read with the checksums checked, as
  every read path and ``pixfeed verify`` use it (protocols: ``protocol.py``).
* ``image`` is a uint8 CHW RGB tensor; ``size=`` and ``crop=`` ("center" or
  "random": random-resized crop + horizontal flip drawn from torch's RNG)
  give every image one shape; ``transform`` is applied last.  ``make_loader``
  seeds the RNGs per sample from (seed, epoch, index) (``pixfeed.seeds``), so
  a crop does not depend on the worker that made it; ``deterministic`` says
  when reading draws no random numbers at all.
* Encoded records: a center crop is torchvision's ``Resize(floor(S / crop_ratio))``
  + ``CenterCrop(S)`` (``crop_ratio`` default 224/256; see ``pixfeed.image.geometry``).
  Stored pixels were resized at pack time: ``size=`` smaller than them is a
  CenterCrop of them, so ``crop_ratio`` is refused there.
* ``exact`` means what it means in ``decode`` (same default, False): True
  decodes encoded records with Pillow throughout, pixel for pixel as
  torchvision's Pillow transforms (and pixels-mode packs) do.
"""
from __future__ import annotations

import os
import warnings
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..image import buffers as batchbuffers
from ..checksum import record_hash
from ..image.decode import CROP_MODES, CROP_RATIO, decode, parse_size, random_resized_crop, resize
from ..image.geometry import center_slices, check_crop_ratio
from ..image import pool as decodepool
from .. import keyindex
from ..errors import CorruptDataError, DatasetError, DatasetNotFoundError, Location, OptionError
from ..storage.bounded import MANIFEST_BYTES, check_size, read_open
from ..storage.bounded import loads as bounded_loads
from ..storage.chunkcache import TIMEOUT
from ..storage.chunked import open_remote
from ..storage.chunkfile import ChunkFile
from ..fields import BUILTIN, codec, from_json, select
from ..manifest import read_manifest
from ..storage.pagecache import Extents
from ..storage.paths import check_dataset_links, open_inside
from ..storage.store import Store, is_url, join, local_path
from .fieldvalues import FieldValues, sample_rng, sample_rngs


class ImageRecords(FieldValues):
    """Manifest, handle management and record decoding (no torch Dataset base)."""
    format = ""

    streams = False  # True: reads data files sequentially from a URL; False: stages them to the local cache
    # True: with checksums on, every byte taken from the data file is checked (records by their xxh3_64, headers
    # against the manifest), so a chunk cache of any chunk_bytes needs no per-chunk hashes (pixfeed.storage.chunked)
    checks_data_file = False
    reads_into = False  # True: read_checked(indices, out=) gathers stored pixels into ``out`` (a mixture's rows)

    def __init__(self, path, transform=None, *, size=None, crop: str = "center", crop_ratio: Optional[float] = None,
                 checksums: bool = True, exact: bool = False, verify: Optional[bool] = None,
                 storage_options: Optional[dict] = None, cache_dir=None, cache_limit=None, chunk_bytes=None,
                 storage_timeout: float = TIMEOUT, fields: Optional[Sequence[str]] = BUILTIN,
                 allow_links: bool = False, manifest: Optional[dict] = None):
        if not is_url(path) and local_path(path).is_dir():  # before anything in it is read
            check_dataset_links(local_path(path), allow_links)
        # manifest: what read_manifest returned for this path, not parsed again (open_dataset, verify)
        self.manifest = manifest if manifest is not None else read_manifest(path, storage_options, allow_links)
        self.allow_links = allow_links  # symbolic links, HDF5 external links and storage (docs/untrusted-data.md)
        self.remote = Store(path, storage_options) if is_url(path) else None
        self.chunks = None  # a ChunkCache when the data file is read through chunks (pixfeed.storage.chunked)
        if self.remote is not None and not self.streams and self.manifest["format"] == self.format:
            self.path, self.chunks = open_remote(path, self.manifest, storage_options, cache_dir, cache_limit,
                                                 chunk_bytes, storage_timeout,
                                                 checked=self.checks_data_file and _checksums(checksums, verify))
            self.remote = None
            check_dataset_links(self.path)  # the cache's copy: pixfeed's own files only
        else:
            self.path = self.remote.url if self.remote is not None else local_path(path)
        if self.manifest["format"] != self.format:
            raise DatasetError(f"{self.path}: is a {self.manifest['format']!r} dataset, not {self.format!r}; "
                               "use pixfeed.open_dataset(path) to open any format")
        if crop not in CROP_MODES:
            raise OptionError(f"crop {crop!r}: expected one of {', '.join(CROP_MODES)}")
        if crop == "random" and size is None:
            raise OptionError("crop='random' needs size=, the output size of the random-resized crop")
        self.transform, self.size, self.crop = transform, parse_size(size), crop
        self.checksums = _checksums(checksums, verify)
        self.exact = exact  # as in decode: False = the fast path (see pixfeed.image.decode, rule 6)
        self.classes: Optional[List[str]] = self.manifest["classes"]
        self.store: str = self.manifest["store"]
        self.crop_ratio = self._crop_ratio(crop_ratio)
        self.schema = from_json(self.manifest.get("schema"), self.path)
        self.per_box = tuple(self.manifest.get("per_box") or ())
        self.fields = select(fields, self.schema, self.path)  # names in order, or None: a dict of all
        self.default_fields = self.fields == BUILTIN
        self._handle, self._pid, self._keys = None, None, None

    def _crop_ratio(self, value: Optional[float]) -> float:
        if value is not None and self.store == "pixels":
            raise OptionError(f"{self.path}: crop_ratio applies to encoded records; this dataset stores pixels "
                              f"already resized at pack time, so size= smaller than them is a center crop of them "
                              f"(pack --size 256 and read size=224 for Resize(256) + CenterCrop(224))")
        return CROP_RATIO if value is None else check_crop_ratio(value)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_handle=None, _pid=None, _keys=None)
        return state

    def __len__(self) -> int:
        return self.manifest["count"]

    def _sizes(self) -> dict:
        """{data file: size} of the files present."""
        if self.remote is not None:
            return self.remote.list()
        sizes = {name: (self.path / name).stat().st_size for name in self.manifest["files"]
                 if (self.path / name).is_file()}
        if self.chunks is not None:
            sizes[self.chunks.name] = self.chunks.size  # the bucket's listing was checked when opened
        return sizes

    def data_file(self, name: str):
        """Where to read data file ``name``: its local path, or a ChunkFile through the chunk cache."""
        return ChunkFile(self.chunks) if self.chunks is not None and name == self.chunks.name else self.path / name

    def open_local(self, name: str, buffering: int = 0):
        """Local data file ``name`` opened for reading (unbuffered by default): the file ``open_inside`` opened
        and checked (a symbolic link, even one swapped in after the constructor's scan, is OutsideDatasetError
        unless ``allow_links``), so the bytes read are the dataset's own."""
        return os.fdopen(open_inside(self.path, name, self.allow_links), "rb", buffering=buffering)

    def check_files(self) -> None:
        """Raise unless every data file is present at the size the manifest records."""
        sizes = self._sizes()
        for name, meta in self.manifest["files"].items():
            p, size = join(self.path, name), sizes.get(name)
            if size is None:
                raise DatasetNotFoundError(f"{p}: data file missing from the {self.format} dataset {self.path}")
            if size != meta["bytes"]:
                raise CorruptDataError(f"{p}: {size} bytes, but the manifest records {meta['bytes']}; the file is "
                                       f"truncated or damaged (run 'pixfeed verify {self.path}')")

    def key(self, i: int) -> str:
        """Record ``i``'s key: from the key index (nothing per record kept in memory), or, for packs
        without one and for URLs, from ``keys.json``, parsed once per process (``_keys``: either)."""
        entry = self.manifest.get("key_index")
        if entry and self.remote is None:
            if self._keys is None:  # opened once per process (not pickled)
                self._keys = keyindex.KeyIndex(self.path, entry, self.allow_links)
            return self._keys[i]
        if self._keys is None:
            self._keys = self._read_keys()
        return self._keys[i]

    def _read_keys(self) -> List[str]:
        """``keys.json``'s list, read within MANIFEST_BYTES (a special file or a larger one is a named error
        before anything is read: pixfeed.errors.SpecialFileError, OverLimitError), damage a CorruptDataError."""
        name = self.manifest["keys_file"]
        where = join(self.path, name)
        if self.remote is not None:  # at most one byte past the limit is fetched
            text = self.remote.read_range(name, 0, MANIFEST_BYTES + 1)
            check_size(len(text), MANIFEST_BYTES, where, "keys file")
        else:
            text = read_open(open_inside(self.path, name, self.allow_links), MANIFEST_BYTES, where, "keys file")
        try:
            keys = bounded_loads(text, where)
        except ValueError as e:
            raise CorruptDataError(f"{where}: the keys file is not valid JSON ({e})") from None
        if not isinstance(keys, list):
            raise CorruptDataError(f"{where}: the keys file holds {type(keys).__name__}, not a list of keys")
        return keys

    def keys(self) -> List[str]:
        """Every record's key, in record order: one read, for tools that need them all (a repack)."""
        entry = self.manifest.get("key_index")
        if entry and self.remote is None:
            return keyindex.read_all(self.path, entry, self.manifest["count"], self.allow_links)
        return [self.key(i) for i in range(len(self))]

    def lazy_extents(self, name: str, ranges, whole=()) -> Extents:
        """Where records lie in data file ``name``: ``ranges(records)`` gives (starts, lengths) of the
        records read-ahead asks for, a window at a time; their mean length from the manifest."""
        mean = self.manifest["files"][name]["bytes"] / max(len(self), 1)
        return Extents(self.path / name, whole=list(whole), ranges=ranges, count=len(self), mean_length=mean)

    def where(self, i: int) -> str:
        try:
            return f"{self.path}: record {i} (key {self.key(i)!r})"
        except (OSError, ValueError, IndexError):
            return f"{self.path}: record {i}"

    def check_checksum(self, data, expected: int, i: int) -> None:
        """Raise CorruptDataError unless ``data`` hashes to ``expected`` (when ``checksums`` is on)."""
        if self.checksums and record_hash(data) != int(expected):
            raise CorruptDataError(f"{self.where(i)}: stored bytes fail their xxh3_64 checksum (damaged data); "
                                   f"run 'pixfeed verify {self.path}'")

    @property
    def stored_shape(self) -> Optional[Tuple[int, int, int]]:
        shape = self.manifest["shape"]
        return tuple(shape) if shape else None

    @property
    def fixed_shape(self) -> Optional[Tuple[int, int, int]]:
        """(3, H, W) when every image comes out at one shape (before ``transform``) and a batch can be
        read in one call (``get_batch``): no fields, or fields with the image and none that follows it."""
        if not self.default_fields and (self.fields is None or "image" not in self.fields or self._geometric()):
            return None
        if self.size is not None:
            return (3, *self.size)
        if self.stored_shape is not None:
            return (3, *self.stored_shape[:2])
        return None

    @property
    def deterministic(self) -> bool:
        """True when reading a sample draws no random numbers (no random crop, no transform)."""
        return self.crop != "random" and self.transform is None

    @property
    def rng_per_sample(self) -> bool:
        """True when every number reading draws comes from ``sample_rng(index)`` (a random crop, no
        ``transform``): the loader then seeds per sample inside one batched read."""
        return self.crop == "random" and self.transform is None

    @property
    def cpu_bound(self) -> bool:
        """False when reading needs no per-sample CPU work beyond a copy."""
        return not (self.store == "pixels" and self.transform is None and self.crop == "center"
                    and self._slice_crop() is not None)

    def _slice_crop(self) -> Optional[Tuple[slice, slice]]:
        """CenterCrop of stored pixels as slices, if ``size`` fits inside them (else None)."""
        h, w = self.stored_shape[:2]
        H, W = self.size or (h, w)
        return None if H > h or W > w else center_slices(h, w, (H, W))

    def pixels(self, stored, i: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
        """Stored record -> HxWx3 uint8 array at the requested size and crop (a random crop drawn
        from ``rng``, by default ``sample_rng(i)``)."""
        if self.crop == "random" and rng is None:
            rng = sample_rng(i)
        if self.store == "encoded":
            return decode(bytes(stored), size=self.size, crop=self.crop, crop_ratio=self.crop_ratio, rng=rng,
                          where=Location(self.where, i), exact=self.exact)
        if self.crop == "random":
            from PIL import Image
            return np.asarray(random_resized_crop(Image.fromarray(np.asarray(stored)), self.size, rng))
        crop = self._slice_crop()
        if crop is not None:
            return stored[crop]
        from PIL import Image
        return np.asarray(resize(Image.fromarray(np.asarray(stored)), self.size, "crop"))

    def sample(self, stored, label, i: int, rng=None):
        img = self.pixels(stored, i, rng)
        tensor = torch.from_numpy(img if img.flags.writeable else img.copy()).permute(2, 0, 1)
        if self.transform is not None:
            tensor = self.transform(tensor)
        return tensor, int(label)


def _checksums(checksums: bool, verify: Optional[bool]) -> bool:
    if verify is None:
        return checksums
    warnings.warn("verify= is deprecated: it is named checksums= now (pixfeed verify is the command that "
                  "checks a whole dataset)", DeprecationWarning, stacklevel=3)
    return verify


class MapImageDataset(ImageRecords, torch.utils.data.Dataset):
    """Map-style pixfeed dataset.  Formats implement ``_open`` and ``read_stored``."""

    @property
    def handle(self):
        """The format's open data handle, opened once per process."""
        if self._pid != os.getpid():
            self._handle = None
            self.check_files()
            self._handle = self._open()
            self._pid = os.getpid()
        return self._handle

    def _open(self):
        raise NotImplementedError

    def read_stored(self, indices: np.ndarray):
        """Return (stored records, labels, checksums) for valid ``indices``, unchecked:
        one transaction or slice per batch where the format allows it."""
        raise NotImplementedError

    def _indices(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = idx[(idx < -n) | (idx >= n)][0]
            raise IndexError(f"{self.path}: index {bad} out of range for a dataset of {n} records")
        return np.where(idx < 0, idx + n, idx)

    def read_checked(self, indices: Sequence[int]):
        """(indices made non-negative, stored records, labels), checksums checked."""
        return self.read_verified(indices)[:3]

    def read_verified(self, indices: Sequence[int]):
        """``read_checked``'s records and the checksums they were checked against (unchecked when
        ``checksums`` is off): a repack keeps a record's checksum rather than hash it again."""
        idx = self._indices(indices)
        stored, labels, checksums = self.read_stored(idx)
        for rec, expected, i in zip(stored, checksums, idx):
            self.check_checksum(rec, expected, int(i))
        return idx, stored, labels, checksums

    def iter_verified(self, indices: Sequence[int], block: int = 256) -> Iterator[tuple]:
        """(index, stored record, checksum) of each of ``indices``, checksums checked, read ``block`` at a
        time (a repack's source).  A record may be a view that holds only until the next is asked for."""
        for start in range(0, len(indices), block):
            idx, stored, _, sums = self.read_verified(indices[start:start + block])
            yield from zip(idx.tolist(), stored, sums)

    def __getitem__(self, i: int):
        if not self.default_fields:
            return self.__getitems__([i])[0]
        idx, stored, labels = self.read_checked([i])
        return self.sample(stored[0], labels[0], int(idx[0]))

    def __getitems__(self, indices: Sequence[int]) -> list:
        if self.default_fields:
            idx, stored, labels = self.read_checked(indices)
            rngs = sample_rngs(idx) if self.crop == "random" else [None] * len(idx)  # one draw for the batch
            return [self.sample(s, l, int(i), r) for s, l, i, r in zip(stored, labels, idx, rngs)]
        names = [f.name for f in self.schema if self.fields is None or f.name in self.fields]
        if self.needs_image():
            idx, stored, labels = self.read_checked(indices)
        else:
            idx = self._indices(indices)
            stored, labels = [None] * len(idx), self.read_labels(idx)
        raw = self.read_fields(idx, names)
        return [self.assemble(s, l, r, int(i)) for s, l, r, i in zip(stored, labels, raw, idx)]

    def read_labels(self, indices: np.ndarray) -> np.ndarray:
        """The labels of valid ``indices``, without reading their images."""
        raise NotImplementedError

    def read_fields(self, indices: np.ndarray, names: Sequence[str]) -> List[dict]:
        """{name: stored bytes} of the fields ``names`` of valid ``indices``, checksums checked."""
        raise NotImplementedError

    def get_batch(self, indices: Sequence[int], threads: int = 1, out: Optional[np.ndarray] = None
                  ) -> Tuple[torch.Tensor, ...]:
        """One gathered read: (uint8 N x 3 x H x W in channels_last strides, int64 labels); with
        ``fields=`` (a tuple with the image, and no field that follows its geometry), the fields in
        that order, each collated as ``make_loader`` collates them.  ``threads``: decode the batch's
        images on that many threads (``pixfeed.image.pool``; make_loader's ``decode_threads``).  ``out``: an
        N x H x W x 3 uint8 array the images are written into (a mixture's rows of its batch, pixfeed.mix)."""
        if self.fixed_shape is None:
            raise DatasetError(f"{self.path}: images have different sizes (pass size=), or fields={self.fields} "
                               "need per-sample reads; read it by index or through make_loader")
        idx, images, labels = self._image_batch(indices, threads, out)
        if self.default_fields:
            return images, labels
        raw = self.read_fields(idx, [n for n in self.fields if n not in BUILTIN])
        columns = {"image": images, "label": labels}
        for f in self.schema:
            if f.name in self.fields:
                columns[f.name] = codec.column([codec.decode(f, r[f.name]) for r in raw])
        return tuple(columns[n] for n in self.fields)

    def read_into(self, indices: Sequence[int], out: np.ndarray) -> np.ndarray:
        """The images of ``indices`` written into ``out`` (N x H x W x 3 uint8), checksums checked, and their
        labels (int64): for a reader that ``reads_into`` and does no per-sample work (``cpu_bound`` False),
        one pass over each record and nothing else per batch (a mixture's rows of its batch, pixfeed.mix)."""
        _, _, labels = self.read_checked(indices, out=out, crop=self._slice_crop())
        return labels

    def _image_batch(self, indices: Sequence[int], threads: int = 1, out: Optional[np.ndarray] = None
                     ) -> Tuple[np.ndarray, torch.Tensor, torch.Tensor]:
        shape = self.fixed_shape
        if self.reads_into and not self.cpu_bound:  # stored pixels cropped by slicing: read straight into the batch
            idx, batch, labels = self.read_checked(indices, out=out, crop=self._slice_crop())
        else:
            idx, stored, labels = self.read_checked(indices)
            if isinstance(stored, np.ndarray) and not self.cpu_bound:
                rows, cols = self._slice_crop()
                batch = stored[:, rows, cols]
                if out is not None:
                    np.copyto(out, batch)
                    batch = out
                elif self.size is not None and not batch.flags.c_contiguous:
                    batch = _copied(batch)
            else:
                batch = batchbuffers.empty((len(idx), shape[1], shape[2], 3)) if out is None else out
                rngs = sample_rngs(idx) if self.crop == "random" else [None] * len(idx)  # one draw for the batch

                def one(j: int) -> None:
                    batch[j] = self.pixels(stored[j], int(idx[j]), rngs[j])
                decodepool.run(one, len(idx), threads)
        images = torch.from_numpy(batch).permute(0, 3, 1, 2)
        if self.transform is not None:
            images = torch.stack([self.transform(x) for x in images])
        return idx, images, torch.from_numpy(np.asarray(labels, dtype=np.int64))


def _copied(arr: np.ndarray) -> np.ndarray:
    out = batchbuffers.empty(arr.shape, arr.dtype)
    np.copyto(out, arr)
    return out
