"""Check a packed dataset against its manifest (``pixfeed verify``, in ``verify_cli.py``).

Works for every format from the manifest and the format's reader, and reports
every problem it finds (not only the first), each naming the file, shard,
record index or key:

1. files: every data file (and wds shard) is present with its recorded size
   and xxh3_64;
2. count: ``keys.json`` and the shards agree with the manifest's count;
3. records: every record is read through the reader with its checksum
   checked, and its label is a valid class index (or -1, unlabelled, as a flat source's are);
   an encoded record is held to the pack's acceptance rule (``check_encoded``:
   header, bomb limit, end marker, CRCs, 12-bit JPEGs and scan counts);
   ``deep`` also decodes it and checks its shape: pixels records against the
   manifest's shape, encoded ones against their image header (after EXIF
   orientation), which is what the packer recorded.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional

import numpy as np

from ..checksum import stream_hash
from ..image.decode import check_encoded, decode
from ..errors import PixfeedError
from ..manifest import read_manifest
from ..storage.bounded import MANIFEST_BYTES, read_object, read_open
from ..storage.paths import open_inside
from ..storage.store import Store, is_url, join, local_path

_CHUNK = 64
MAX_RECORD_PROBLEMS = 1000  # then verify stops reading records: its verdict stands, in bounded time


def _capped(problems: Iterator[str], most: int) -> Iterator[str]:
    """The first ``most`` problems, then one saying the rest of the records were not read."""
    for n, problem in enumerate(problems):
        if n == most:
            yield f"stopped after {most:,} record problems; the rest of the records were not read"
            return
        yield problem
Progress = Optional[Callable[[int], object]]


@dataclass
class Report:
    path: object                     # Path, or the URL string
    records: int = 0                 # records read and checked
    files: int = 0                   # data files checked
    problems: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(path, deep: bool = False, progress: Progress = None, storage_options: Optional[dict] = None,
           allow_links: bool = False, manifest: Optional[dict] = None) -> Report:
    """Check the dataset at ``path`` (a folder or a URL: its objects are hashed as they stream,
    records are read as the reader reads them); raise DatasetError only if its manifest is unusable.
    Nothing outside the dataset is read: a file reached through a symbolic link (or an HDF5 external
    link or storage) is a problem, not read, unless ``allow_links``.  ``manifest``: what ``read_manifest``
    returned for ``path`` (parsed once)."""
    remote = Store(path, storage_options) if is_url(path) else None
    root = remote.url if remote else local_path(path)
    manifest = manifest if manifest is not None else read_manifest(root, storage_options, allow_links)
    report = Report(root)
    opened = None if remote else (lambda name: open_inside(root, name, allow_links))  # the file checked is read
    report.problems += _check_files(root, manifest, report, remote, opened)
    report.problems += _check_count(root, manifest, remote, opened)
    report.problems += _capped(_check_records(root, manifest, deep, report, progress or (lambda n: None),
                                              storage_options, allow_links), MAX_RECORD_PROBLEMS)
    report.problems = [_without_verify_advice(p) for p in report.problems]
    return report


_ADVICE = re.compile(r"(;|,)? ?\(?run 'pixfeed verify [^']*'\)?")


def _without_verify_advice(problem: str) -> str:
    """A problem as verify reports it: the readers' advice to "run 'pixfeed verify ...'" left out (it is
    running)."""
    return _ADVICE.sub("", problem)


def _file_entries(manifest: dict) -> dict:
    entries = dict(manifest["files"])
    for shard in manifest.get("shards") or []:
        entries.setdefault(shard["name"], shard)
    return entries


def _check_files(root, manifest: dict, report: Report, remote: Optional[Store], opened) -> Iterator[str]:
    """Each data file's size and xxh3_64; a local file is opened once (``open_inside``: no link followed,
    no FIFO opened) and its size and bytes are those of the descriptor."""
    try:
        sizes = remote.list() if remote else None
    except PixfeedError as e:
        yield f"files not checked: {e}"
        return
    for name, meta in sorted(_file_entries(manifest).items()):
        p = join(root, name)
        report.files += 1
        try:
            if remote:
                size = sizes[name]
                digest = size == meta["bytes"] and _hash(p, name, remote)
            else:
                with os.fdopen(opened(name), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    digest = size == meta["bytes"] and stream_hash(f)
            if size != meta["bytes"]:
                yield f"{p}: {size} bytes, but the manifest records {meta['bytes']} (truncated or damaged)"
            elif digest != meta["xxh3_64"]:
                yield f"{p}: xxh3_64 {digest} does not match the manifest's {meta['xxh3_64']} (damaged)"
        except PixfeedError as e:  # a link, a FIFO or device (as the data file listed in the manifest)
            yield str(e)
        except (FileNotFoundError, KeyError):
            yield f"{p}: data file missing (listed in the manifest)"
        except OSError as e:
            yield f"{p}: cannot read ({e.strerror or e})"


def _hash(path, name: str, remote: Store) -> str:
    with remote.open(name) as f, remote.errors(str(path)):
        return stream_hash(f)


def _check_count(root, manifest: dict, remote: Optional[Store], opened) -> Iterator[str]:
    if not manifest.get("keys_file"):
        yield f"{root}: the manifest names no keys_file (the record keys)"
        return
    name = manifest["keys_file"]
    n, path = manifest["count"], join(root, name)
    try:
        keys = json.loads(read_object(remote, name, MANIFEST_BYTES, path, "keys file") if remote else
                          read_open(opened(name), MANIFEST_BYTES, path, "keys file"))
    except PixfeedError as e:
        yield str(e)
        return
    except (OSError, ValueError, RecursionError) as e:
        yield f"{path}: cannot read the record keys ({e})"
        return
    if not isinstance(keys, list) or len(keys) != n:
        yield f"{path}: holds {len(keys) if isinstance(keys, list) else 'no list of'} keys, manifest count is {n}"
    shards = manifest.get("shards")
    if shards and sum(s["count"] for s in shards) != n:
        yield f"{root}: shards hold {sum(s['count'] for s in shards)} records, manifest count is {n}"


def _check_records(root, manifest: dict, deep: bool, report: Report, progress,
                   storage_options: Optional[dict], allow_links: bool = False) -> Iterator[str]:
    from ..datasets import open_dataset
    from ..datasets.protocol import CheckedReads

    try:
        ds = open_dataset(str(root), checksums=True, storage_options=storage_options, fields=None,
                          allow_links=allow_links, manifest=manifest)
        if not isinstance(ds, CheckedReads):
            yield from _check_stream(ds, manifest, deep, report, progress)
            return
        ds.check_files()
        getattr(ds, "handle", None)  # opened here: a file its library refuses is one problem, not one a record
    except (PixfeedError, OSError) as e:
        yield f"records not checked: {e}"
        return
    try:  # the byte ranges read-ahead is given (an LMDB or HDF5 pack's extents.npy: of the records' count)
        ds.record_extents() if callable(getattr(ds, "record_extents", None)) else None
    except (PixfeedError, OSError) as e:
        yield str(e)
    for start in range(0, len(ds), _CHUNK):
        chunk = range(start, min(start + _CHUNK, len(ds)))
        for i, stored, label, problem in _read(ds, chunk, report):
            if problem is None:
                where = ds.where(i)
                problem = _label_problem(where, label, manifest) or _image_problem(where, stored, manifest, deep)
            if problem:
                yield problem
        progress(len(chunk))


def _read(ds, chunk: range, report: Report) -> Iterator[tuple]:
    """(index, stored, label, problem) per record; a chunk that fails is re-read one by one."""
    try:
        idx, stored, labels = ds.read_checked(list(chunk))
        _read_fields(ds, idx)
    except Exception:  # noqa: BLE001 - re-read record by record, to name each bad one
        yield from (_read_one(ds, i, report) for i in chunk)
        return
    report.records += len(idx)
    yield from ((i, s, label, None) for i, s, label in zip(idx.tolist(), stored, labels))


def _read_fields(ds, idx) -> None:
    """Read every field of ``idx``, checking its checksums (CorruptDataError names the record and field)."""
    if ds.schema:
        ds.read_fields(np.asarray(idx, dtype=np.int64), [f.name for f in ds.schema])


def _read_one(ds, i: int, report: Report) -> tuple:
    try:
        _, stored, labels = ds.read_checked([i])
        _read_fields(ds, [i])
    except Exception as e:  # noqa: BLE001 - a reader's library may raise its own types on damage
        msg = str(e) if isinstance(e, PixfeedError) else f"cannot read ({type(e).__name__}: {e})"
        return i, None, None, msg if f"record {i}" in msg else f"{ds.where(i)}: {msg}"
    report.records += 1
    return i, stored[0], labels[0], None


def _check_shards(ds, manifest: dict, deep: bool, report: Report, progress) -> Iterator[str]:
    """A wds pack through its reader's ``check_each``: every damaged sample is one problem and the walk goes on
    (damage to a shard's tar structure ends only that shard)."""
    seen = 0
    for i, where, stored, label, problem in ds.check_each():
        seen += i is not None
        if problem is None:
            report.records += 1
            problem = _label_problem(where, label, manifest) or _image_problem(where, stored, manifest, deep)
            progress(1)
        if problem:
            yield problem
    if seen != manifest["count"]:
        yield f"{ds.path}: {seen} records found in the shards, manifest count is {manifest['count']}"


def _check_stream(ds, manifest: dict, deep: bool, report: Report, progress) -> Iterator[str]:
    """Iterable readers (wds) check checksums and decode as they stream; check what comes out."""
    if callable(getattr(ds, "check_each", None)):  # pixfeed's wds reader: every sample, shard by shard
        yield from _check_shards(ds, manifest, deep, report, progress)
        return
    shape = manifest.get("shape") and (3, *manifest["shape"][:2])
    try:
        for sample in ds:
            image, label = sample["image"], sample["label"]
            where = f"{ds.path}: record {report.records} in stream order"
            report.records += 1
            yield from filter(None, [_label_problem(where, label, manifest),
                                     deep and shape and tuple(image.shape) != shape
                                     and f"{where}: image of shape {tuple(image.shape)}, expected {shape}"])
            progress(1)
    except Exception as e:  # noqa: BLE001 - reported; the stream cannot continue past it
        yield f"{ds.path}: reading stopped after {report.records} records: {type(e).__name__}: {e}"
    if report.records != manifest["count"]:
        yield f"{ds.path}: {report.records} records read, manifest count is {manifest['count']}"


def _label_problem(where: str, label, manifest: dict) -> Optional[str]:
    classes, label = manifest["classes"], int(label)
    if label == -1 or (0 <= label if classes is None else 0 <= label < len(classes)):
        return None  # -1: unlabelled; no classes: sparse class ids, as .cls or pack_samples give
    valid = "-1 (unlabelled) or a class index" if classes is None else f"0..{len(classes) - 1}, or -1 (unlabelled)"
    return f"{where}: label {label} is out of range (expected {valid})"


def _image_problem(where: str, stored, manifest: dict, deep: bool) -> Optional[str]:
    """``deep``: ``_shape_problem``.  Otherwise an encoded record is held to the pack's acceptance rule
    (``check_encoded`` without decoding: header, bomb limit, end marker, CRCs), so that a record an older
    pack let in and no reader decodes (a 12-bit JPEG) is named."""
    if deep:
        return _shape_problem(where, stored, manifest)
    if manifest["store"] == "pixels":
        return None
    try:
        check_encoded(bytes(stored), where, _max_pixels(manifest))
    except PixfeedError as e:
        return str(e)
    return None


def _max_pixels(manifest: dict) -> Optional[int]:
    """The decompression-bomb limit the dataset was packed under (None: Pillow's)."""
    limit = (manifest.get("options") or {}).get("max_pixels")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def _shape_problem(where: str, stored, manifest: dict) -> Optional[str]:
    """Decode ``stored``; compare its shape with the recorded one."""
    try:
        if manifest["store"] == "pixels":
            got, want = tuple(np.asarray(stored).shape), tuple(manifest["shape"])
        else:
            data = bytes(stored)
            want = check_encoded(data, where, _max_pixels(manifest))[1]
            got = decode(data, where=where, max_pixels=_max_pixels(manifest)).shape[:2]
    except PixfeedError as e:
        return str(e)
    return None if got == want else f"{where}: decodes to shape {got}, but {want} was recorded"
