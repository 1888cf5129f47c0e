"""Reader of the WebDataset format (layout: pixfeed.layouts.wds), an IterableDataset.

Record ``i`` is the ``i``-th sample in manifest shard order (``keys.json[i]``
is its key).  Each epoch (``set_epoch``) is split like this:

1. Shard order: the manifest's, or shuffled from ``(seed, epoch)``, the same
   on every rank.
2. Ranks: the epoch's stream of N samples is cut into ``world_size``
   contiguous ranges of exactly ``N // world_size`` samples, and rank r reads
   range r.  Every rank yields the same number of samples (``len(ds)``), so a
   DDP job never waits on a rank that ran out; no sample comes twice in an
   epoch; the last ``N % world_size`` samples of the stream are left out
   (fewer than ``world_size``, others each epoch when shards are shuffled).
   Dropping beats repeating: a repeat is an unrequested extra weight on a
   sample and a duplicate in evaluation.  A rank whose range starts inside a
   shard reads past that shard's first samples (at most one shard per epoch).
3. DataLoader workers: each DataLoader worker collates its own batches, so
   the rank's stream is cut into one contiguous range per worker, each a whole
   number of batches of ``worker_batch`` samples (``make_loader`` sets it to
   its ``batch_size``) but one, which ends with the rank's last partial batch
   and comes last in the DataLoader's turn order: the loader yields exactly
   ``len(loader)`` batches, ``drop_last`` or not, as for map-style datasets
   (a worker's own partial batch each made it yield more).  A worker whose
   range starts inside a shard walks past that shard's first samples (at most
   one shard per worker).  With fewer shards than workers, every worker reads
   all of them and keeps every ``num_workers``-th batch of ``worker_batch``
   samples (a one-time warning says so; pack with a smaller ``--shard-size``
   to avoid the extra reads; from local shards only the kept samples' members
   are read, the others' headers walked).  A worker left with nothing ends at
   once.
4. Shuffling: a buffer of ``buffer`` samples per worker (stored bytes, decoded
   on the way out), seeded from ``(seed, epoch, rank, worker)``.
5. Random crops and transforms draw from RNGs seeded per sample from
   ``(seed, epoch, record index)`` (``pixfeed.seeds``).
6. Resuming (``resume``, driven by ``pixfeed.loaders.resume``): worker ``w``
   skips the first ``n_w`` samples of its shuffled stream without decoding
   them (their stored bytes are still read through the shuffle buffer, which
   must see them to reproduce the order), and DataLoader worker 0 reads the
   stream of the worker that was next in turn.

The epoch lives in a one-number tensor in shared memory, so persistent
DataLoader workers see ``set_epoch`` from the main process (their copies of a
plain attribute would not); a plain ``pickle`` copy takes the value only.

``rank``/``world_size``, when not given, follow torch.distributed's world
(0 and 1 without a process group), looked up again at every ``set_epoch``,
except while Hugging Face Accelerate runs several processes: its prepared
loaders split the batches themselves, so the dataset yields them all
(``World.detect(wrapped=True)``).  A ``make_loader`` loader sets them when
each epoch starts.  Each sample is checked: the image
member (``.jpg``/``.png``, or ``.npy`` loaded with ``allow_pickle=False``)
exists, its xxh3_64 matches the ``.json`` (unless ``checksums=False``), the
``.json`` index matches the sample's place, and each shard holds its manifest
count.  Local shards are read by a walk of their tar headers
(``pixfeed.sources._tarwalk``; ``_walk`` groups members as webdataset does),
URLs streamed through tarfile, headers checked as the walk checks them
(``_tarwalk.stream``) and grouped by webdataset's ``group_by_keys``; webdataset's decoders are never used,
bytes become pixels only in ``pixfeed.image.decode``.

A URL dataset (``s3://...``) is streamed: each shard is read front to back
through one fsspec file (sequential GETs, an 8 MiB read-ahead buffer), never
copied whole; a read failure is a StorageError naming the shard's URL.
"""
from __future__ import annotations

import functools
from contextlib import nullcontext
import json
import os
import random
import re
import tarfile
import warnings
from itertools import islice
from typing import Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info
from webdataset import shuffle as buffer_shuffle
from webdataset.tariterators import group_by_keys

from ..errors import CorruptDataError, DatasetError, Location, OptionError, PixfeedError, StorageError
from .skips import DAMAGED, SkipLog
from ..fields.members import from_member
from ..layouts.wds import META_EXTENSION, image_extensions
from ..seeds import sample_rngs, seeded_by_index
from ..sources import _tarwalk
from ..storage.bounded import IMAGE_BYTES, check_size, load_npy
from ..storage.store import join
from ..storage.options import mask
from ..storage.paths import open_inside
from ..machine.world import World
from .base import ImageRecords

Piece = Tuple[int, int, int]  # (shard, first sample, stop sample)
_META = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta
_WARNED: set = set()
SKIPPED = object()  # a damaged record left out (on_error="skip")


class WdsImageDataset(ImageRecords, IterableDataset):
    """``WdsImageDataset(path, transform=None, *, size=None, crop="center", crop_ratio=None, checksums=True,
    exact=False, shuffle=True, buffer=1000, seed=0, rank=None, world_size=None)``; yields ``(image, label)``.

    ``size``, ``crop``, ``checksums`` and any other option go to ImageRecords."""
    format = "wds"
    streams = True
    epoch_in_shared_memory = True  # persistent workers see set_epoch (pixfeed.loaders.plan)
    skips: Optional[SkipLog] = None  # make_loader(on_error="skip"): damaged records left out, counted here

    def __init__(self, path, transform=None, *, shuffle: bool = True, buffer: int = 1000, seed: int = 0,
                 rank=None, world_size=None, **options):
        if not isinstance(path, (str, os.PathLike)):
            raise OptionError(f"path {path!r}: give the directory of a pixfeed wds dataset "
                              "(its manifest lists the shards), not a list of shard URLs")
        super().__init__(path, transform, **options)
        if buffer < 0 or seed < 0:
            raise OptionError(f"buffer={buffer}, seed={seed}: both must be non-negative integers")
        self.shuffle, self.buffer, self.seed = shuffle, buffer, seed
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._own_world = rank is None and world_size is None  # follow the process group's
        self.rank, self.world_size = _world(rank, world_size)
        self.shards = _shard_table(self.manifest, self.path)
        self.warn_shared_shards = True  # make_loader says so itself, where its caller sees it
        self._starts = np.cumsum([0] + [s["count"] for s in self.shards])
        self._resume = None
        self.worker_batch = 1  # samples a DataLoader worker collates together (make_loader: its batch_size)

    def __getitem__(self, index):
        raise TypeError(f"{self.path}: a wds dataset is read as a stream of its shards (an IterableDataset), not "
                        f"by index: iterate it (or make_loader it), or repack it for random access: "
                        f"pixfeed pack {self.path} NEW --format mmap")

    def __len__(self) -> int:
        """Samples this rank yields per epoch."""
        return self.manifest["count"] // self.world_size

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)
        if self._own_world:
            self.rank, self.world_size = _world(None, None)

    def shard_paths(self) -> list:
        """The shards' paths (or URLs), in manifest order; checks their presence and size once per process."""
        if self._pid != os.getpid():
            self.check_files()
            self._pid = os.getpid()
        return self._joined

    @functools.cached_property
    def _joined(self) -> list:
        return [join(self.path, s["name"]) for s in self.shards]

    def where(self, i: int) -> str:
        shard = self.shards[int(np.searchsorted(self._starts, i, side="right")) - 1]
        return f"{super().where(i)} in shard {shard['name']}"

    def resume(self, epoch: int, worker_consumed: Optional[List[int]], first_worker: int = 0) -> None:
        """Make epoch ``epoch`` skip, in each worker, the first ``worker_consumed[w]`` samples of its
        stream, with DataLoader worker 0 reading worker ``first_worker``'s (``pixfeed.loaders.resume``)."""
        self._resume = None if worker_consumed is None else (int(epoch), list(worker_consumed), int(first_worker))

    def worker_counts(self, workers: int) -> List[int]:
        """Samples each of ``workers`` DataLoader workers yields this epoch on this rank."""
        counts = []
        for worker in range(workers):
            pieces, stride = self._worker_pieces(self._rank_pieces(), worker, workers)
            total, block = sum(stop - first for _, first, stop in pieces), self.worker_batch
            counts.append(sum(min(block, total - b * block) for b in range(worker % stride, -(-total // block),
                                                                           stride)))
        return counts

    def __iter__(self) -> Iterator:
        paths = self.shard_paths()
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        worker, skip = self._resumed(worker, workers)
        pieces, stride = self._worker_pieces(self._rank_pieces(), worker, workers)
        records = self._select(paths, pieces, stride, worker % stride, block=self.worker_batch)
        if self.shuffle and self.buffer > 1:
            # SeedSequence mixes the four numbers fully; Random("0-0-0-0") and Random("0-1-0-0")
            # were seen to draw the same first picks, repeating an epoch's order
            key = np.random.SeedSequence([self.seed, self.epoch, self.rank, worker]).generate_state(1, np.uint64)
            rng = random.Random(int(key[0]))
            records = buffer_shuffle(self.buffer, initial=self.buffer, rng=rng)(records)
        for s, i, sample in islice(records, skip, None):
            # a random crop draws from (seed, epoch, i) as the map-style formats' do (seeds.crop_draws); a
            # transform from the global RNGs seeded so: both depend on the sample, not the worker
            with seeded_by_index(self.seed, self.epoch), \
                    (sample_rngs(self.seed, self.epoch, i) if self.transform is not None else nullcontext()):
                item = self._decode_or_skip(s, i, sample)
            if item is not SKIPPED:
                yield item

    def _resumed(self, worker: int, workers: int) -> Tuple[int, int]:
        """(the worker whose stream this one reads, samples of it to skip) for this epoch."""
        if self._resume is None or self._resume[0] != self.epoch:
            return worker, 0
        _, consumed, first = self._resume
        if len(consumed) != workers:
            raise OptionError(f"{self.path}: resuming epoch {self.epoch} saved with {len(consumed)} DataLoader "
                              f"workers, but reading with {workers}; make the loader with num_workers="
                              f"{len(consumed)}")
        worker = (worker + first) % workers
        return worker, consumed[worker]

    def _rank_pieces(self) -> List[Piece]:
        """The parts of shards this rank reads this epoch, in reading order."""
        order = np.arange(len(self.shards))
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(order)
        lo, hi = self.rank * len(self), (self.rank + 1) * len(self)
        pieces, pos = [], 0
        for s in order:
            n = self.shards[s]["count"]
            if pos < hi and pos + n > lo:
                pieces.append((int(s), max(lo - pos, 0), min(hi - pos, n)))
            pos += n
        return pieces

    def _worker_pieces(self, pieces: List[Piece], worker: int, workers: int) -> Tuple[List[Piece], int]:
        """(pieces this worker reads, keep every stride-th batch of ``worker_batch`` samples of them)."""
        if len(pieces) >= workers:
            return cut(pieces, *worker_range(sum(stop - first for _, first, stop in pieces), self.worker_batch,
                                               worker, workers)), 1
        if worker == 0 and self.warn_shared_shards and self.path not in _WARNED:
            _WARNED.add(self.path)
            warnings.warn(f"{self.path}: rank {self.rank} reads {len(pieces)} shard(s) with {workers} DataLoader "
                          f"workers; every worker reads them all and keeps 1 sample in {workers} (pack with a "
                          f"smaller --shard-size to give each worker whole shards)", stacklevel=3)
        return pieces, workers

    def read_range(self, first: int, stop: int, fields: bool = False, images: bool = True) -> Iterator[tuple]:
        """(record index, stored image: bytes or pixels, label, {field: stored bytes} when ``fields``)
        of records ``first`` to ``stop - 1`` in record order, each read once from its shard, checksums
        checked: a repack's source (``pixfeed.packers.fromdataset``).  ``images=False`` (local shards):
        in place of the image, where its member lies, unread, as ``read_places`` takes it: (shard,
        offset, size, xxh3_64)."""
        pieces = [(s, max(first - int(lo), 0), min(stop - int(lo), shard["count"]))
                  for s, (shard, lo) in enumerate(zip(self.shards, self._starts))
                  if lo < stop and lo + shard["count"] > first]
        if not images and self.remote is not None:
            raise OptionError(f"{self.path}: only local shards are read by place")
        exts = image_extensions(self.store)
        for s, i, sample in self._select(self.shard_paths(), pieces, 1, 0, () if images else exts):
            where, stored, label = self._image(s, i, sample, images)
            if not images:
                stored = (s, *next(sample[e] for e in exts if e in sample), _meta(sample, where, i)[0])
            yield i, stored, label, self._fields(sample, where, i) if fields else {}

    def read_places(self, places) -> Iterator[tuple]:
        """(record index, stored image, its xxh3_64) for each (record index, shard, offset, size,
        xxh3_64) of ``places`` (``read_range(images=False)``'s), read at those bytes and checked."""
        files: dict = {}
        try:
            for i, s, offset, size, expected in places:
                if s not in files:
                    if len(files) == 64:  # a shuffled task's records come from every shard
                        files = _close(files)
                    files[s] = open_inside(self.path, self.shards[s]["name"], self.allow_links)
                data = os.pread(files[s], size, offset)
                if len(data) != size:
                    raise CorruptDataError(f"{self.where(i)}: the shard ends inside its image member (truncated)")
                yield i, self._stored(data, expected, i, Location(self.where, i)), expected
        finally:
            _close(files)

    def check_each(self) -> Iterator[tuple]:
        """(record index or None, where, stored image or None, label or None, problem or None) of every record,
        shard by shard in record order, its checksums checked (``pixfeed verify``): a damaged sample is one
        problem and the walk goes on; damage to a shard's tar structure ends that shard (one problem naming it
        and the last key read) and the walk goes on with the next shard."""
        paths = self.shard_paths()
        for s, shard in enumerate(self.shards):
            try:
                for _, i, sample in self._select(paths, [(s, 0, shard["count"])], 1, 0):
                    try:
                        where, stored, label = self._image(s, i, sample, True)
                        self._fields(sample, where, i)
                    except PixfeedError as e:
                        yield i, None, None, None, str(e)
                        continue
                    yield i, where, stored, label, None
            except PixfeedError as e:
                yield None, None, None, None, str(e)

    def _select(self, paths: list, pieces: List[Piece], stride: int, offset: int, sized=(),
                block: int = 1) -> Iterator[tuple]:
        """(shard, record index, sample) of every ``stride``-th block of ``block`` samples of the pieces
        from block ``offset`` on; a local shard's members of the extensions ``sized`` are their (offset,
        size), unread."""
        m = 0  # samples of the pieces before this one
        for (s, first, stop), stream in zip(pieces, self._streams(paths, [s for s, _, _ in pieces])):
            def wanted(j: int, before: int = m - first) -> bool:
                return j >= first and (before + j) // block % stride == offset
            for j, sample in enumerate(self._shard(paths[s], stop, self.shards[s]["count"], stream, wanted, sized)):
                if sample is not None:
                    yield s, int(self._starts[s]) + j, sample
            m += stop - first

    def _streams(self, paths: list, shards: List[int]) -> Iterator:
        """The shards' files in reading order: local files, or from a URL sequential GETs with
        read-ahead, the next shard opened and its first block fetched while this one is read."""
        if self.remote is None:
            return (self.open_local(self.shards[s]["name"], -1) for s in shards)  # the files checked, no link
        return self.remote.open_ahead([self.shards[s]["name"] for s in shards])

    def _shard(self, path, stop: int, count: int, stream, wanted, sized=()) -> Iterator[Optional[dict]]:
        """The first ``stop`` samples of a shard as webdataset dicts, None for those not ``wanted(j)``
        (a local shard's left unread); damage names the shard and key."""
        n, key = 0, None
        try:
            with stream as f:
                samples = group_by_keys(_stream_files(f, str(path))) \
                    if self.remote is not None else _walk(f, wanted, sized)
                for sample in samples:
                    key = sample["__key__"]
                    yield sample if wanted(n) else None
                    n += 1
                    if n == stop:
                        return
        except PixfeedError:
            raise
        except (tarfile.TarError, OSError, ValueError) as e:
            if self.remote is not None and not isinstance(e, (tarfile.TarError, ValueError)):
                raise StorageError(f"{path}: read failed after member key {key!r} "
                                   f"({type(e).__name__}: {mask(str(e), self.remote.options)})") from None
            raise CorruptDataError(f"{path}: damaged tar after member key {key!r} "
                                   f"({e.args[0] if e.args else type(e).__name__})") from None
        raise CorruptDataError(f"{path}: ends after {n} samples (last member key {key!r}), but the manifest "
                               f"records {count}; the shard is truncated or damaged")

    def _decode_or_skip(self, s: int, i: int, sample: dict):
        """``_decode``, or with ``skips`` (make_loader(on_error="skip")) SKIPPED for a damaged record."""
        try:
            return self._decode(s, i, sample)
        except DAMAGED as error:
            if self.skips is None:
                raise
            self.skips.record(error)
            return SKIPPED

    def _decode(self, s: int, i: int, sample: dict):
        # a caption-only read neither checks nor decodes the image
        where, stored, label = self._image(s, i, sample, self.default_fields or self.needs_image())
        if self.default_fields:
            return self.sample(stored, label, i)
        return self.assemble(stored, label, self._fields(sample, where, i), i)

    def _image(self, s: int, i: int, sample: dict, read: bool) -> tuple:
        """(where, the stored image with its checksum checked, or None unless ``read``, label) of record ``i``."""
        where = f"{self._joined[s]}: member key {sample['__key__']!r} (record {i})"
        exts = image_extensions(self.store)
        data = next((sample[e] for e in exts if e in sample), None)
        if data is None:
            found = sorted(k for k in sample if not k.startswith("__"))
            raise CorruptDataError(f"{where}: no .{' or .'.join(exts)} image member (found: {', '.join(found)})")
        expected, label = _meta(sample, where, i)
        return where, self._stored(data, expected, i, where) if read else None, label

    def _stored(self, data: bytes, expected: int, i: int, where):
        """Record ``i``'s image member as stored (bytes, or pixels), its checksum checked."""
        self.check_checksum(data, expected, i)
        return self._array(data, where) if self.store == "pixels" else data

    def _fields(self, sample: dict, where: str, i: int) -> dict:
        """{name: stored bytes} of the requested fields' members (``K.NAME.EXT``), checksums checked."""
        sums = _json(sample).get("fields") or {}
        size = self.stored_shape[:2] if self.store == "pixels" else None
        out = {}
        for f in self.schema:
            if self.fields is not None and f.name not in self.fields:
                continue
            member = next((v for k, v in sample.items() if k.partition(".")[0] == f.name and "." in k), None)
            if member is None or f.name not in sums:
                raise CorruptDataError(f"{where}: no .{f.name}.* member or checksum for field {f.name}")
            self.check_field(f.name, member, int(sums[f.name], 16), i)
            out[f.name] = from_member(f, member, self.store, size, where)
        return out

    def _array(self, data: bytes, where: str) -> np.ndarray:
        try:
            arr = load_npy(data)
        except (ValueError, EOFError, OSError) as e:
            raise CorruptDataError(f"{where}: .npy member cannot be read ({e})") from None
        if arr.dtype != np.uint8 or arr.shape != self.stored_shape:
            raise CorruptDataError(f"{where}: .npy member is {arr.dtype} {arr.shape}, "
                                   f"expected uint8 {self.stored_shape}")
        return arr


def worker_range(total: int, batch: int, worker: int, workers: int) -> Tuple[int, int]:
    """(first, stop) of ``worker``'s contiguous range of a rank's ``total`` samples: whole batches dealt
    evenly, the last partial batch to the worker whose turn follows the last whole batch."""
    batches, partial = divmod(total, batch)
    sizes = [(batches // workers + (w < batches % workers)) * batch + partial * (w == batches % workers)
             for w in range(workers)]
    first = sum(sizes[:worker])
    return first, first + sizes[worker]


def cut(pieces: List[Piece], first: int, stop: int) -> List[Piece]:
    """The parts of ``pieces`` (in order) at positions ``first`` to ``stop - 1`` of their samples."""
    out, pos = [], 0
    for s, lo, hi in pieces:
        a, b = max(lo, lo + first - pos), min(hi, lo + stop - pos)
        if a < b:
            out.append((s, a, b))
        pos += hi - lo
    return out


def _walk(f, wanted, sized=()) -> Iterator[dict]:
    """A local shard's samples as webdataset groups them (``_tarwalk.samples``: many times faster than
    tarfile's stream), extensions lower-cased and webdataset's meta members skipped; the members of
    sample j are read only when ``wanted(j)``, and those of the extensions ``sized`` are their (offset,
    size)."""
    read = _tarwalk.reader(f)
    for j, (key, group) in enumerate(_tarwalk.samples(f, _META.match)):
        sample = {"__key__": key}
        for ext, offset, size in group if wanted(j) else ():
            ext = ext.lower()
            if ext in sample:
                raise ValueError(f"{key}.{ext}: a second member of that name in the sample")
            check_size(size, IMAGE_BYTES, f"{getattr(f, 'name', 'shard')}: member {key}.{ext}")
            sample[ext] = (offset, size) if ext in sized else read(size, offset)
        yield sample


def _stream_files(f, where: str) -> Iterator[dict]:
    """A streamed shard's members as webdataset's ``tar_file_expander`` gives them to ``group_by_keys``
    (meta members skipped), each header checked as a local shard's walk checks it (``_tarwalk.stream``:
    webdataset's reader has no check of a negative or non-octal size, nor a bound on what a member may ask
    for) and each member read within IMAGE_BYTES."""
    for info, tar in _tarwalk.stream(f, where, "r|*"):
        if _META.match(info.name):
            continue
        check_size(info.size, IMAGE_BYTES, f"{where}: member {info.name}")
        yield {"fname": info.name, "data": tar.extractfile(info).read(), "__url__": where}


def _close(files: dict) -> dict:
    for fd in files.values():
        os.close(fd)
    return {}


def _json(sample: dict) -> dict:
    """The sample's ``.json`` member, parsed once."""
    if "__json__" not in sample:
        sample["__json__"] = json.loads(sample[META_EXTENSION])
    return sample["__json__"]


def _meta(sample: dict, where: str, i: int) -> Tuple[int, int]:
    """(checksum, label) from the ``.json`` member, whose index must be ``i``."""
    try:
        meta = _json(sample)
        expected, label, index = int(meta["xxh3_64"], 16), int(meta["label"]), meta["index"]
    except (KeyError, TypeError, ValueError, RecursionError) as e:
        raise CorruptDataError(f"{where}: missing or damaged .json member ({type(e).__name__}: {e})") from None
    if index != i:
        raise CorruptDataError(f"{where}: its .json says record {index}, but its place in the shards makes it "
                               f"record {i}; the shard is damaged or not from this dataset")
    return expected, label


def _world(rank, world_size) -> Tuple[int, int]:
    if rank is None and world_size is None:
        world = World.detect("auto", wrapped=True)
        return world.rank, world.size
    if rank is None or world_size is None or not 0 <= rank < world_size:
        raise OptionError(f"rank={rank}, world_size={world_size}: give both, with 0 <= rank < world_size, "
                          "or neither to use torch.distributed's")
    return rank, world_size


def _shard_table(manifest: dict, path) -> list:
    shards = manifest.get("shards")
    valid = isinstance(shards, list) and all(
        isinstance(s, dict) and s.get("name") in manifest["files"] and isinstance(s.get("count"), int)
        and s["count"] > 0 for s in shards)
    if not valid or sum(s["count"] for s in shards) != manifest["count"]:
        raise DatasetError(f"{path}: the manifest's \"shards\" list is missing, names files it does not list, or "
                           f"does not add up to its count of {manifest['count']}; re-pack the dataset")
    return shards
