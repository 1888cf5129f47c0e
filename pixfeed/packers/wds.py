"""Writer of the WebDataset format (layout: ``pixfeed.layouts.wds``): POSIX tar shards.

Order: samples are shuffled (seed ``--seed``) before sharding, since shards
are read sequentially; ``--no-shuffle`` keeps source order.  Shards hold at
most ``--shard-size`` samples and their files at most ``--shard-bytes``
bytes (a single larger sample gets a shard of its own); with neither, shards
are bounded at 256 MiB: big enough for sequential reads and
negligible per-shard cost, small enough that ImageNet-1k gives ~550 shards,
several whole shards for each of 8 ranks x 8 DataLoader workers.  A dataset
under 16 GiB gets smaller shards, down to 16 MiB, so that it still has 64
(``default_shard_bytes``).  Byte
bounds are planned from source file sizes (encoded; an upper bound when
``--max-side`` re-encodes) or H*W*3 plus the .npy header (pixels).  Under
``--on-error skip`` a shard holds fewer samples; ``finish`` renumbers the
``index`` of later shards and drops shards left empty.

Parallelism: each shard is one pack task, unless there are fewer than four
shards per worker: then each shard is split into pieces (one task each), which
write member streams to ``shard-NNNNNN.tar.part-TTTTTT`` and ``finish`` joins
them into the shard (``pixfeed.packers._tar``): the same bytes as one writer.
A task reserves its file's blocks for the plan's upper bound of its samples
(``_files.reserve``; not with ``--max-side``, whose bound is the source's
bytes) and cuts the file to what it wrote.
"""
from __future__ import annotations

import io
import itertools
import json
import logging
import os
import tarfile
from pathlib import Path
from typing import Iterator, List, Optional

import numpy as np
import xxhash

from ..checksum import file_hash, record_hash
from ..errors import OptionError
from ..fields import codec
from ..fields.members import to_member
from ..layouts.wds import LABEL_EXTENSION, MEMBER_EXTENSIONS, META_EXTENSION, member_keys, shard_name
from ..storage.bounded import planned_size
from . import _tar
from ._files import reserve, writev_all
from .records import Record
from .writer import TaskResult, Writer

log = logging.getLogger(__name__)
DEFAULT_SHARD_BYTES = 256 << 20
MIN_SHARDS, SMALLEST_DEFAULT_SHARD = 64, 16 << 20
_BLOCK, _RECORD = _tar.BLOCK, _tar.RECORD
_TASKS_PER_WORKER = 4
_JSON_FIXED = 192  # the .json member less its key and class name, numbers at their widest


def default_shard_bytes(total: int) -> int:
    """The shard bound without --shard-size or --shard-bytes: 256 MiB, or less for a dataset under
    16 GiB, so that it still makes ``MIN_SHARDS`` shards (down to 16 MiB each): whole shards for
    every DataLoader worker of a few ranks, and a pack task per shard (no pieces to join)."""
    return int(min(DEFAULT_SHARD_BYTES, max(SMALLEST_DEFAULT_SHARD, total // MIN_SHARDS)))


def part_name(shard: int, task: int) -> str:
    return f"{shard_name(shard)}.part-{task:06d}"


def _pad(n) -> np.ndarray:
    return -(-np.asarray(n) // _BLOCK) * _BLOCK


def _header_bytes(name: str) -> int:
    """Tar header bytes of a member named ``name``: a PAX header first if it is long or non-ASCII."""
    size = len(name.encode("utf-8"))
    return _BLOCK if name.isascii() and size <= 100 else 2 * _BLOCK + int(_pad(size + 16))


def _npy(arr: np.ndarray) -> bytes:
    """``np.save(arr, allow_pickle=False)``'s bytes, with one copy of the pixels."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(arr))
    return b"".join((header.getvalue(), memoryview(np.ascontiguousarray(arr)).cast("B")))


_ENCODER = json.JSONEncoder(ensure_ascii=False)  # json.dumps makes one a call for ensure_ascii=False


def _json(meta: dict) -> bytes:
    return _ENCODER.encode(meta).encode("utf-8")


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    tar.addfile(_tar.member_info(name, len(data)), io.BytesIO(data))


class WdsWriter(Writer):
    """Plans shards from source sizes; each task writes a shard or a piece of one."""
    own_fields = True  # fields are members of each sample, written by the task

    def plan(self, workers: int) -> List[np.ndarray]:
        n, opts = len(self.source), self.opts
        if opts.shard_size is not None and opts.shard_size < 1:
            raise OptionError(f"--shard-size {opts.shard_size}: must be at least 1 sample")
        if opts.shard_bytes is not None and opts.shard_bytes < _RECORD:
            raise OptionError(f"--shard-bytes {opts.shard_bytes}: must be at least {_RECORD}, "
                              "the size of one tar record (tar files grow in records)")
        self.names = member_keys(self.source.keys)
        order = np.random.default_rng(opts.seed).permutation(n) if opts.shuffle else np.arange(n)
        estimates = self._estimates()
        ends = self._shard_ends(estimates[order])
        self.shard_starts = [0, *ends]
        tasks = self._split(np.split(order, ends[:-1]), workers)
        end = 2 * _BLOCK + _RECORD  # an archive's end, at most
        # none where --max-side re-encodes: the bounds are then the source files' bytes, far above
        self.reserved = [0 if opts.max_side else int(estimates[t].sum()) + end for t in tasks]
        return tasks

    def _split(self, shards: List[np.ndarray], workers: int) -> List[np.ndarray]:
        """Tasks: whole shards, or pieces of them when there are too few shards to keep workers busy."""
        pieces = -(-_TASKS_PER_WORKER * workers // len(shards))
        tasks = [(shard, piece) for shard, indices in enumerate(shards)
                 for piece in np.array_split(indices, min(pieces, len(indices)))]
        self.shard_of = [shard for shard, _ in tasks]
        self.starts = np.cumsum([0] + [len(piece) for _, piece in tasks])[:-1].tolist()
        return [piece for _, piece in tasks]

    def _estimates(self) -> np.ndarray:
        """Upper bound of each source sample's bytes in a tar file, in source order."""
        if self.opts.store == "pixels":
            h, w = self.opts.size
            payload = np.full(len(self.source), len(_npy(np.zeros((h, w, 3), np.uint8))))
        else:
            payload = self.source.sizes
        classes = self.source.classes  # None for class indices without names (written as null)
        headers = np.array([3 * _header_bytes(f"{name}.{META_EXTENSION}") for name in self.names])
        labels = np.maximum(self.source.labels, 0)
        text = np.array([len(key) + (len(classes[label]) if classes else 0)
                         for key, label in zip(self.source.keys, labels)])
        return headers + _pad(payload) + _BLOCK + _pad(_JSON_FIXED + 6 * text) + self._field_estimates()

    def _field_estimates(self) -> np.ndarray:
        """Upper bound of each sample's field members: a header (PAX for a long name), the bytes (a
        .npy header more), 32 bytes of checksum in the .json; a picture by its source file or pixels."""
        out = np.zeros(len(self.source), np.int64)
        for f in self.source.schema:
            cells = self.source.values[f.name]
            for i, v in enumerate(cells):
                out[i] += 3 * _BLOCK + 32 + int(_pad(self._field_bytes(f, v)))
        return out

    def _field_bytes(self, f, value) -> int:
        if f.type not in ("image", "mask"):
            return len(codec.encode(f, value))
        if self.opts.store == "pixels":
            return self.opts.size[0] * self.opts.size[1] * (3 if f.type == "image" else 1) + 128
        if isinstance(value, bytes) or self.source.remote is not None:
            return len(value) if isinstance(value, bytes) else 0
        try:
            return planned_size((self.source.root / value).stat())  # a sparse file by the blocks it holds
        except OSError:
            return 0  # reported when the file is read

    def _shard_ends(self, sizes: np.ndarray) -> List[int]:
        """End positions of the shards: greedy, closing a shard before either bound is passed."""
        opts, n = self.opts, len(sizes)
        limit = opts.shard_bytes or (None if opts.shard_size else default_shard_bytes(int(sizes.sum())))
        budget = np.inf if limit is None else limit // _RECORD * _RECORD - 2 * _BLOCK
        count = opts.shard_size or n
        cum = np.concatenate([[0], np.cumsum(sizes)])
        ends, start = [], 0
        while start < n:
            end = int(np.searchsorted(cum, cum[start] + budget, side="right")) - 1
            if end <= start:
                log.warning("shard %d: a sample of about %d bytes exceeds --shard-bytes %s; it gets a shard of its own",
                            len(ends), int(sizes[start]), limit)
            start = min(max(end, start + 1), start + count, n)
            ends.append(start)
        return ends

    def _whole(self, task: int) -> bool:
        """Whether ``task`` is a whole shard rather than a piece of one."""
        return self.shard_of.count(self.shard_of[task]) == 1

    def write_task(self, task: int, indices: np.ndarray, records: Iterator[Record]) -> dict:
        shard, whole = self.shard_of[task], self._whole(task)
        path, count, offset = self.root / (shard_name(shard) if whole else part_name(shard, task)), 0, 0
        f = _Hashing(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666))
        try:
            reserve(f.fd, self.reserved[task], path)
            for rec in records:
                offset += f.write(self._sample(rec, self.starts[task] + count))
                count += 1
            if whole:
                offset += f.write([_tar.end(offset)])
            os.ftruncate(f.fd, offset)
        finally:
            os.close(f.fd)
        return _shard_entry(path, count, f.hash.hexdigest()) if whole else {"name": path.name, "count": count}

    def _sample(self, rec: Record, index: int) -> list:
        """The tar members of a sample: the buffers to write, in order (the image's header, its bytes,
        then every later member's bytes joined: three buffers to hash and write, not 3 a member)."""
        payload = _npy(rec.data) if rec.encoding == "raw" else rec.data
        classes = self.source.classes
        named = classes and rec.label >= 0  # -1: unlabelled, no class
        meta = {"key": rec.key, "label": rec.label, "class": classes[rec.label] if named else None,
                "size": list(rec.source_shape), "index": index,
                "xxh3_64": f"{rec.checksum if payload is rec.data else record_hash(payload):016x}"}
        name = self.names[rec.index]
        fields = [(f.name, *to_member(f, rec.fields[f.name], self.opts.store, self.opts.size))
                  for f in self.source.schema]
        if fields:
            meta["fields"] = {field: f"{record_hash(data):016x}" for field, _, data in fields}
        rest = [*_tar.member(f"{name}.{LABEL_EXTENSION}", str(rec.label).encode("ascii")),
                *(b for field, ext, data in fields for b in _tar.member(f"{name}.{field}.{ext}", data)),
                *_tar.member(f"{name}.{META_EXTENSION}", _json(meta))]
        header, data, padding = _tar.member(f"{name}.{MEMBER_EXTENSIONS[rec.encoding]}", payload)
        return [header, data, b"".join((padding, *rest))]

    def finished(self, result: TaskResult) -> List[str]:
        return [result.extra["name"]] if self._whole(result.task) else []

    def finish(self, kept: np.ndarray, results: List[TaskResult]) -> dict:
        shards, start = [], 0
        for shard, group in itertools.groupby(results, key=lambda r: self.shard_of[r.task]):
            entry = self._assemble(shard, list(group), start)
            if entry is not None:
                shards.append(entry)
                start += entry["count"]
        return {"shards": shards}

    def _assemble(self, shard: int, pieces: List[TaskResult], start: int) -> Optional[dict]:
        """Join the pieces of ``shard`` (first sample number ``start``) and renumber it
        if samples were skipped; return its manifest entry, or None if it is empty."""
        path, count = self.root / shard_name(shard), sum(r.extra["count"] for r in pieces)
        if len(pieces) > 1:
            _tar.join([self.root / r.extra["name"] for r in pieces], path)
        if count == 0:
            path.unlink()
            return None
        planned = self.shard_starts[shard + 1] - self.shard_starts[shard]
        if start != self.shard_starts[shard] or count != planned:
            _renumber(path, start)
        elif len(pieces) == 1:
            return pieces[0].extra
        return _shard_entry(path, count)


def _shard_entry(path: Path, count: int, digest: Optional[str] = None) -> dict:
    return {"name": path.name, "count": count, "bytes": path.stat().st_size, "xxh3_64": digest or file_hash(path)}


class _Hashing:
    """A file written a sample's buffers at a time (one ``writev``), hashing what goes through it (a
    shard's xxh3_64 without reading it back)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.hash = fd, xxhash.xxh3_64()

    def write(self, buffers: list) -> int:
        for data in buffers:
            self.hash.update(data)
        return writev_all(self.fd, buffers)


def _renumber(path: Path, start: int) -> None:
    """Number the samples' .json "index" ``start``, ``start + 1``, ... (after skipped samples)."""
    tmp = path.with_name(f"{path.name}.renumber")
    with tarfile.open(path) as src, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as dst:
        index = itertools.count(start)
        for info in src:
            data = src.extractfile(info).read()
            if info.name.endswith(f".{META_EXTENSION}") and info.name.count(".") == 1:  # not a field's K.NAME.json
                meta = json.loads(data)
                meta["index"] = next(index)
                data = _json(meta)
            add_member(dst, info.name, data)
    os.replace(tmp, path)
