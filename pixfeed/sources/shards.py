"""WebDataset tar shards as a source, written by any tool (img2dataset, ``webdataset.ShardWriter``, pixfeed).

``pixfeed pack SRC DST`` where SRC is a folder of ``.tar`` shards, a brace
pattern (``train-{000000..000123}.tar``), one ``.tar`` file, or a URL prefix
of shards in a bucket; ``.tar.gz`` and ``.tgz`` shards as well (streamed: read
through once at the scan and again by the tasks, up to each image, as gzip
allows no random access; each member's decompressed size is checked against
the same limits as a plain shard's before it is read, so a hostile header or a
gzip bomb cannot fill memory).  The driver reads each shard once (never extracted to
disk; a local shard's image members are seeked over, not read): members are grouped into samples as WebDataset groups
them (the member name up to the first dot of its basename is the sample's
key, the rest its extension; members of one sample need not be next to each
other: they are grouped by key across the shard, with a note, since
webdataset's own readers need them adjacent), every member but the image is parsed into a
field then, and the image member's offset and size in the shard are kept;
the pack's tasks read the image bytes by range (a read of the file, or a
ranged GET), in shard order.

By extension: the image is the member whose extension is ``jpg``, ``jpeg``,
``png`` or ``webp`` (``--image-ext`` picks one when a sample has several);
``cls`` is the label (a class index, -1 for unlabelled; the classes are
named "0", "1", ... or by ``--class-names``, or, in shards pixfeed wrote, by the ``class`` of
their ``.json`` members; -1 without any ``cls``); ``txt``, ``text`` and
``caption`` are ``str`` fields, ``json`` a ``json`` field, ``npy`` an
``ndarray`` field (NumPy's format, no pickle), a multi-dot image extension
(``K.depth.png``) an ``image`` field, anything else ``bytes``; ``--field
NAME:TYPE`` overrides a type (``--field mask:mask``, ``--field boxes:boxes``).  A field is named by its extension
(``txt``), or, for a multi-dot one, by the part before its last dot
(``caption.txt`` -> ``caption``, ``mask.png`` -> ``mask``: the member names
pixfeed's own shards use).  A shard that is not a tar or ends early, a sample
without an image, and a member that does not parse stop the pack naming the
shard and member, or with ``--on-error skip`` are left out and listed (and
counted) in the manifest's ``skipped``.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
import zlib
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import OptionError, OverLimitError, PixfeedError, SourceError
from ..fields import Field, check_name, parse_field_option, parse_type
from ..storage.bounded import IMAGE_BYTES, MEMBER_BYTES, check_size, int64, load_npy
from ..storage.store import Store, is_url, local_path
from . import _tarwalk
from .folder import Source
from .infer import check_labels, id_classes, read_class_names, unlabelled_note

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
GZ_SUFFIXES = (".tar.gz", ".tgz")
TEXT_EXTS = ("txt", "text", "caption")
BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def is_shards(src) -> bool:
    """Whether SRC names WebDataset shards: a .tar file, a brace pattern, or a folder holding .tar files
    and no sub-folders (an image folder has class folders or images)."""
    text = str(src)
    if is_shard_name(text) or BRACE.search(text):
        return True
    if is_url(src):
        return False  # a bucket prefix is a folder source unless scan_shards finds only shards (scan_source)
    root = local_path(src)
    if not root.is_dir():
        return False
    entries = [e for e in os.scandir(root) if not e.name.startswith(".")]
    return any(is_shard_name(e.name) for e in entries) and not any(e.is_dir() for e in entries)


def is_shard_name(name: str) -> bool:
    """Whether a file name is a tar shard's: ``.tar``, or gzip-compressed ``.tar.gz`` / ``.tgz``."""
    return str(name).lower().endswith(SHARD_SUFFIXES)


def is_gzipped(name: str) -> bool:
    return str(name).lower().endswith(GZ_SUFFIXES)


def shard_names(src, store: Optional[Store]) -> Tuple[object, List[str]]:
    """(the root the names are relative to, the shard names in order); SourceError when none match."""
    text = str(src).rstrip("/")
    match = BRACE.search(text)
    if match:
        lo, hi = match.groups()
        head, tail = text[:match.start()], text[match.end():]
        root, _, prefix = head.rpartition("/")
        names = [f"{prefix}{i:0{len(lo)}d}{tail}" for i in range(int(lo), int(hi) + 1)]
    elif is_shard_name(text):
        root, _, name = text.rpartition("/")
        names = [name]
    else:
        root = text
        names = sorted(n for n in (store.list() if store else os.listdir(text)) if is_shard_name(n))
    root = root if store is not None else local_path(root or ".")
    if store is None:
        missing = [n for n in names if not (root / n).is_file()]
        if missing and (match or len(names) == 1):
            raise SourceError(f"{src}: no shard {root / missing[0]}"
                              + (f" (and {len(missing) - 1} more of the pattern's {len(names)})" if len(missing) > 1 else ""))
    if not names:
        raise SourceError(f"{src}: no .tar (or .tar.gz) shards there")
    return root, names


RUN_BYTES = 64 << 20  # the most one ranged GET of a task's images reads
RUN_GAP = 1 << 20  # other members between two images that one GET still spans


class ShardSource(Source):
    """Samples of tar shards; image bytes located by (shard, offset, size)."""
    shards: List[str] = []
    where_of: List[str] = []
    extents: Optional[np.ndarray] = None  # [shard index, offset, size] per sample

    def where(self, i: int) -> str:
        return self.where_of[i]

    def field_where(self, i: int, name: str) -> str:
        return f"{self.where_of[i]}, member .{name}"

    def fetch(self, indices) -> Iterator[Tuple[int, object]]:
        indices = [int(i) for i in indices]
        if any(is_gzipped(n) for n in self.shards):  # runs of one gzip-compressed shard, streamed
            run: List[int] = []
            for i in indices + [-1]:
                if run and (i < 0 or self._gz(i) != self._gz(run[0]) or
                            (self._gz(i) and self.extents[i][0] != self.extents[run[0]][0])):
                    yield from (self._fetch_gz(run) if self._gz(run[0]) else self._fetch_plain(run))
                    run = []
                run.append(i)
            return
        yield from self._fetch_plain(indices)

    def _gz(self, i: int) -> bool:
        return is_gzipped(self.shards[int(self.extents[i][0])])

    def _fetch_gz(self, run: List[int]) -> Iterator[Tuple[int, object]]:
        """Images of one gzip-compressed shard: its stream decompressed up to each (forward; rewound
        for an image behind the last), one image in memory at a time."""
        name = self.shards[int(self.extents[run[0]][0])]
        where = self.remote.url_of(name) if self.remote is not None else str(self.root / name)
        with (self.remote.open(name) if self.remote is not None else open(self.root / name, "rb")) as raw, \
                gzip.GzipFile(fileobj=raw) as f:
            for i in run:
                offset, size = int(self.extents[i][1]), int(self.extents[i][2])
                try:
                    if offset < f.tell():
                        f.seek(0)
                    f.seek(offset)
                    data = f.read(size)
                except (OSError, EOFError, zlib.error) as e:
                    yield i, SourceError(f"{where}: cannot read the image at {offset} of the decompressed shard "
                                         f"({type(e).__name__}: {e})")
                    continue
                yield i, data if len(data) == size else SourceError(
                    f"{where}: {len(data)} bytes at {offset} of the decompressed shard, {size} expected; the shard "
                    "changed or shrank since it was scanned")

    def _fetch_plain(self, indices: List[int]) -> Iterator[Tuple[int, object]]:
        if self.remote is not None:
            yield from self._fetch_runs(indices)
            return
        fd, current = None, None
        try:
            for i in indices:
                shard, offset, size = (int(v) for v in self.extents[i])
                if shard != current:
                    if fd is not None:
                        os.close(fd)
                    fd, current = os.open(self.root / self.shards[shard], os.O_RDONLY), shard
                data = os.pread(fd, size, offset)  # one read call (a buffered seek and read took three)
                yield i, data if len(data) == size else SourceError(
                    f"{self.root / self.shards[shard]}: {len(data)} bytes at {offset}, {size} expected; the shard "
                    "changed or shrank since it was scanned")
        finally:
            if fd is not None:
                os.close(fd)


    def _fetch_runs(self, indices: List[int]) -> Iterator[Tuple[int, object]]:
        """From a bucket: images that follow one another in a shard (the usual order of a task) come
        from one ranged GET of up to RUN_BYTES, their other members in between, instead of one GET each."""
        run: List[int] = []
        for i in indices:
            if run and not self._extends(run, i):
                yield from self._read_run(run)
                run = []
            run.append(i)
        if run:
            yield from self._read_run(run)

    def _extends(self, run: List[int], i: int) -> bool:
        (shard, first, _), (last_shard, offset, size) = self.extents[run[0]], self.extents[run[-1]]
        next_shard, next_offset, next_size = self.extents[i]
        return (next_shard == shard == last_shard and 0 <= next_offset - (offset + size) <= RUN_GAP
                and next_offset + next_size - first <= RUN_BYTES)

    def _read_run(self, run: List[int]) -> Iterator[Tuple[int, object]]:
        shard, lo = int(self.extents[run[0]][0]), int(self.extents[run[0]][1])
        hi = int(self.extents[run[-1]][1] + self.extents[run[-1]][2])
        blob = self.remote.read_range(self.shards[shard], lo, hi)
        if len(blob) != hi - lo:
            raise SourceError(f"{self.remote.url_of(self.shards[shard])}: {len(blob)} bytes at {lo}, {hi - lo} "
                              "expected; the shard changed or shrank since it was scanned")
        for i in run:
            offset, size = int(self.extents[i][1]) - lo, int(self.extents[i][2])
            yield i, blob[offset:offset + size]


def scan_shards(src, image_ext: Optional[str] = None, on_error: str = "fail",
                storage_options: Optional[dict] = None, fields: Sequence[str] = (),
                map_fn: Callable = map, class_names=None) -> ShardSource:
    """The samples of the shards at ``src``, each shard's headers walked once, a shard per ``map_fn``
    job (``map``, or a pack's local workers: ``Executor.map``; a bucket's shards are fetched there too)."""
    store = Store(str(src).rstrip("/") if not BRACE.search(str(src)) and not is_shard_name(str(src))
                  else str(src).rpartition("/")[0], storage_options) if is_url(src) else None
    root, names = shard_names(src, store)
    if image_ext is not None and image_ext.lower().lstrip(".") not in IMAGE_EXTS:
        raise OptionError(f"--image-ext {image_ext!r}: expected one of {', '.join(IMAGE_EXTS)}")
    class_names = read_class_names(class_names)
    walked = list(map_fn(lambda name: _walk(root, name, store, image_ext, on_error), names))
    samples = [(s, key, sample) for s, (found, _, _) in enumerate(walked) for key, sample in found]
    notes = [note for _, noted, _ in walked for note in noted]
    skipped = [entry for _, _, left in walked for entry in left]
    if not samples:
        first = f"; first reason: {skipped[0]['reason']}" if skipped else ""
        raise SourceError(f"{src}: no sample with an image in {len(names)} shard(s){first}")
    out = _source(src, root, names, store, samples, notes, fields, class_names)
    out.skipped = skipped
    return out


def _walk(root, name: str, store: Optional[Store], image_ext: Optional[str], on_error: str) -> tuple:
    """([(key, sample)], notes, skipped) of one shard; a bad sample or shard raises, or is left out
    under ``on_error="skip"`` (``skipped``: the manifest's {"path", "reason"} entries)."""
    where = f"{root}/{name}" if store is not None else str(root / name)
    samples, notes, skipped, dropped = [], [], [], []
    try:
        grouped, apart, broken = _grouped(where, _samples(root, name, store.read(name) if store is not None else None,
                                                          dropped))
        if dropped:
            notes.append(f"{where}: left out {len(dropped)} member(s) that are not regular files (first: "
                         f"{dropped[0][0]!r}, {dropped[0][1]}); links, FIFOs and devices in a shard are never read")
        if apart:
            notes.append(f"{where}: the members of {len(apart)} sample(s) are not next to each other in the tar "
                         f"(first: {apart[0]!r}); pixfeed grouped them by key across the shard, but webdataset and "
                         "other streaming readers take each run of one key as a sample: write shards with "
                         "'tar --sort=name' (GNU tar) or webdataset's ShardWriter")
        for key, members in grouped:
            try:
                samples.append((key, _sample(where, key, members, image_ext)))
            except SourceError as e:
                if on_error == "fail":
                    raise
                skipped.append({"path": f"{where}: sample {key!r}", "reason": str(e)})
        if broken is not None:
            raise broken
    except (tarfile.TarError, EOFError, OSError, zlib.error, SourceError) as e:
        kind = "gzip-compressed tar" if is_gzipped(name) else "tar"
        error = e if isinstance(e, SourceError) else SourceError(
            f"{where}: not a readable {kind} shard, or it ends early ({type(e).__name__}: {e})")
        if on_error == "fail":
            raise error from None
        skipped.append({"path": where, "reason": f"{error}; the rest of the shard is left out (after "
                                                 f"{len(samples) + len(skipped)} sample(s))"})
    return samples, notes, skipped


def _grouped(where: str, groups) -> tuple:
    """([(key, {ext: member})] in the order keys first appear, [keys whose members were apart], the error
    that stopped the walk or None): runs of one key that are not next to each other joined (``tar -cf``
    lists a folder in readdir order); a member named twice is an error of its sample."""
    merged: Dict[str, dict] = {}
    apart: List[str] = []
    try:
        for key, members in groups:
            if key not in merged:
                merged[key] = members
                continue
            if key not in apart:
                apart.append(key)
            twice = [ext for ext in members if ext in merged[key]]
            if twice:
                merged[key] = {**merged[key], **members, _TWICE: SourceError(
                    f"{where}: sample {key!r} has member {key}.{twice[0]} twice; each member name once per shard")}
            else:
                merged[key].update(members)
    except (tarfile.TarError, EOFError, OSError, zlib.error, SourceError) as e:  # the samples before it stand
        return list(merged.items()), apart, e
    return list(merged.items()), apart, None


_TWICE = "\0twice"  # a sample's member named twice (no member extension holds a NUL)


def _samples(root, name: str, data: Optional[bytes], dropped: Optional[list] = None
             ) -> Iterator[Tuple[str, Dict[str, Tuple[int, int, bytes]]]]:
    """(key, {ext: (offset, size, bytes or None for the image kinds)}) per run of one key, in shard order
    (a gzip-compressed shard's offsets are those of its decompressed stream); a member over its limit
    (IMAGE_BYTES, MEMBER_BYTES) is an OverLimitError, one named twice in a run an error of its sample;
    ``dropped`` gets (name, kind) of the members that are not regular files."""
    if is_gzipped(name):
        yield from _gz_samples(root, name, data, dropped)
        return
    with io.BytesIO(data) if data is not None else open(root / name, "rb") as f:
        read = _tarwalk.reader(f)
        for key, group in _tarwalk.samples(f, where=str(root / name) if data is None else f"{root}/{name}",
                                           dropped=dropped):
            members: dict = {}
            for ext, offset, size in group:  # the image: by range, later
                image = ext.lower() in IMAGE_EXTS
                check_size(size, IMAGE_BYTES if image else MEMBER_BYTES, f"{root}/{name}: member {key}.{ext}")
                if ext in members:
                    members[_TWICE] = SourceError(f"{root}/{name}: sample {key!r} has member {key}.{ext} twice; "
                                                  "each member name once per shard")
                members[ext] = (offset, size, None if image else read(size, offset))
            yield key, members


def _gz_samples(root, name: str, data: Optional[bytes], dropped: Optional[list] = None
                ) -> Iterator[Tuple[str, Dict[str, Tuple[int, int, bytes]]]]:
    """``_samples`` of a gzip-compressed shard, read as a stream (tarfile's ``r|gz``): members in order,
    the non-image ones read, each within its limit (IMAGE_BYTES, MEMBER_BYTES) decompressed before it is
    read, so a gzip bomb or a lying header costs no more memory than a plain shard's member."""
    where = f"{root}/{name}" if data is not None else str(root / name)
    key, group = None, {}
    with io.BytesIO(data) if data is not None else open(root / name, "rb") as raw:
        for info, tar in _tarwalk.stream(raw, where, "r|gz", dropped):
            folder, _, base = info.name.rpartition("/")
            stem, dot, ext = base.partition(".")
            if not dot:
                continue
            this = f"{folder}/{stem}" if folder else stem
            image = ext.lower() in IMAGE_EXTS
            check_size(info.size, IMAGE_BYTES if image else MEMBER_BYTES, f"{where}: member {this}.{ext}")
            if this != key and group:
                yield key, group
                group = {}
            key = this
            if ext in group:
                group[_TWICE] = SourceError(f"{where}: sample {key!r} has member {key}.{ext} twice; each member "
                                            "name once per shard")
            group[ext] = (info.offset_data, info.size, None if image else tar.extractfile(info).read())
    if group:
        yield key, group


def _sample(where: str, key: str, members: dict, image_ext: Optional[str]) -> dict:
    if _TWICE in members:
        raise members[_TWICE]
    for ext in members:
        try:
            f"{key}.{ext}".encode("utf-8")
        except UnicodeEncodeError:
            raise SourceError(f"{where}: member {ascii(key + '.' + ext)} is not named in UTF-8, which keys and "
                              "field names must be; rename it") from None
    images = sorted(e for e in members if e.lower() in IMAGE_EXTS)
    if image_ext is not None:
        images = [e for e in images if e.lower() == image_ext.lower().lstrip(".")]
    if not images:
        raise SourceError(f"{where}: sample {key!r} has no image member (members: "
                          f"{', '.join(key + '.' + e for e in members)})")
    if len(images) > 1:
        raise SourceError(f"{where}: sample {key!r} has two image members, {key}.{images[0]} and {key}.{images[1]}; "
                          f"choose one with --image-ext")
    image = images[0]
    out = {"image": members[image][:2], "path": f"{key}.{image}", "fields": {}, "label": -1, "cls": False}
    for ext, (_, _, raw) in members.items():
        if ext == image:
            continue
        last = ext.rpartition(".")[2].lower()
        name = ext.rpartition(".")[0] or ext
        if raw is None:  # a second plain image extension (K.jpg and K.png, --image-ext chose one): left out
            continue
        if ext == "cls":
            out["label"], out["cls"] = _parse(where, key, ext, _cls)(raw), True
        else:
            out["fields"][name] = (last, _parse(where, key, ext, _PARSERS.get(last, bytes))(raw))
    return out


def _npy(raw: bytes) -> np.ndarray:
    return load_npy(raw)


def _cls(raw: bytes) -> int:
    """A ``.cls`` member's class index (an int64; the sign is checked with every label, check_labels)."""
    return int64(int(raw.decode().strip()), "", "label")


_PARSERS = {**{e: (lambda b: b.decode("utf-8")) for e in TEXT_EXTS}, "json": lambda b: json.loads(b), "npy": _npy}


def _parse(where: str, key: str, ext: str, parse):
    def parsed(raw: bytes):
        try:
            return parse(raw)
        except PixfeedError as e:
            raise type(e)(f"{where}: member {key}.{ext}: {e}") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise SourceError(f"{where}: member {key}.{ext} does not parse ({type(e).__name__}: {e})") from None
        except RecursionError:
            raise OverLimitError(f"{where}: member {key}.{ext} is JSON nested deeper than Python's parser takes "
                                 "(about 1,000 levels)") from None
    return parsed


PIXFEED_META = {"key", "label", "class", "size", "index", "xxh3_64", "fields"}  # pixfeed's own .json (packers/wds.py)


def _own_class_names(samples: list, labels: np.ndarray) -> Optional[List[str]]:
    """Shards pixfeed wrote: every sample's ``.json`` is pixfeed's meta member, naming the class of its
    ``.cls`` label (``"class": "boat"``).  Then the class names are those (label k: the name its samples
    carry, one name a label, a name a label) and the ``.json`` members, the old pack's bookkeeping, are
    no field of the new one; else None, and nothing changes."""
    metas = [s["fields"].get("json") for _, _, s in samples]
    if not all(m is not None and isinstance(m[1], dict) and "class" in m[1] and set(m[1]) <= PIXFEED_META
               for m in metas):
        return None
    named: Dict[int, str] = {}
    for label, (_, meta) in zip(labels.tolist(), metas):
        name = meta["class"]
        if label < 0:
            continue
        if not isinstance(name, str) or named.setdefault(label, name) != name:
            return None
    top = int(labels.max()) if len(labels) else -1
    if sorted(named) != list(range(top + 1)) or len(set(named.values())) != len(named):
        return None
    for _, _, s in samples:
        del s["fields"]["json"]
    return [named[k] for k in range(top + 1)]


def _source(src, root, names: List[str], store: Optional[Store], samples: list, notes: List[str],
            given: Sequence[str], class_names=None) -> ShardSource:
    keys = [key for _, key, _ in samples]
    seen: Dict[str, int] = {}
    for i, key in enumerate(keys):
        if key in seen:
            raise SourceError(f"{src}: two samples of key {key!r}, in {names[samples[seen[key]][0]]} and "
                              f"{names[samples[i][0]]}; keys must be unique")
        seen[key] = i
    labels = np.array([s["label"] for _, _, s in samples], np.int64)
    has = np.array([s["cls"] for _, _, s in samples], bool)
    if has.any() and not has.all():
        i, j = int(np.argmax(has)), int(np.argmax(~has))
        raise SourceError(f"{src}: sample {keys[i]!r} has a .cls member but {keys[j]!r} has none; every sample "
                          "needs its label (-1 for unlabelled), or none")
    check_labels(labels, lambda k: f"{names[samples[k][0]]}: member {keys[k]}.cls")
    if class_names is None and has.all():
        class_names = _own_class_names(samples, labels)
    classes = id_classes(labels, class_names)  # .cls: class indices, -1 unlabelled
    note = has.any() and unlabelled_note(labels, f"{src}: .cls")
    if note:
        notes = [*notes, note]
    out = ShardSource(root if store is None else store.url, [s["path"] for _, _, s in samples], keys, labels, classes,
                      np.array([s["image"][1] for _, _, s in samples], np.int64), notes=notes, remote=store)
    out.shards, out.walked = names, not (BRACE.search(str(src)) or is_shard_name(str(src)))
    out.where_of = [f"{out.root}/{names[shard]}: sample {key!r}" for shard, key, _ in samples]
    out.extents = np.array([(shard, *s["image"]) for shard, _, s in samples], np.int64).reshape(-1, 3)
    out.schema = _overridden(src, _schema(src, out, [s["fields"] for _, _, s in samples]), given)
    out.values = {f.name: [s["fields"].get(f.name, (None, None))[1] for _, _, s in samples] for f in out.schema}
    out.origin = {"kind": "shards", "source": str(src), "shards": len(names)}
    return out


def _schema(src, source: ShardSource, fields: List[dict]) -> List[Field]:
    """One field per member name, its type from the extension; a name whose extension or array kind
    changes between samples is an error naming both samples."""
    first: Dict[str, Tuple[int, str]] = {}
    for i, sample in enumerate(fields):
        for name, (ext, _) in sample.items():
            j, seen = first.setdefault(name, (i, ext))
            if seen != ext:
                raise SourceError(f"{src}: field {name!r} is .{seen} in {source.where(j)} but .{ext} in "
                                  f"{source.where(i)}; one field has one type")
    schema = []
    for name, (i, ext) in first.items():
        check_name(name, f"{source.where(i)}: member", "rename the member (KEY.NAME.EXT) in the shard")
        missing = [k for k, s in enumerate(fields) if name not in s]
        if missing:
            raise SourceError(f"{source.where(missing[0])}: has no member .{name} that {source.where(i)} has; "
                              "every sample needs every field")
        schema.append(_field(name, ext, [s[name][1] for s in fields], source))
    return schema


def _overridden(src, schema: List[Field], given: Sequence[str]) -> List[Field]:
    """The schema with ``--field NAME:TYPE`` applied (``--field mask:mask`` for a ``K.mask.png`` member)."""
    overrides = dict(parse_field_option(g) for g in given)
    names = [f.name for f in schema]
    unknown = [n for n in overrides if n not in names]
    if unknown:
        raise OptionError(f"--field {unknown[0]}: the shards of {src} have no member named {unknown[0]!r}; their "
                          f"fields: {', '.join(names) or 'none'}")
    return [parse_type(f.name, overrides[f.name], "--field") if f.name in overrides else f for f in schema]


def _field(name: str, ext: str, values: list, source: ShardSource) -> Field:
    if ext in TEXT_EXTS:
        return Field(name, "str")
    if ext in IMAGE_EXTS:
        return Field(name, "image")
    if ext == "json":
        return Field(name, "json")
    if ext != "npy":
        return Field(name, "bytes")
    dtypes, shapes = {v.dtype.str for v in values}, {v.shape for v in values}
    if len(dtypes) > 1 or len({len(s) for s in shapes}) > 1 or len({s[1:] for s in shapes}) > 1:
        kinds = sorted(f"{v.dtype}{list(v.shape)}" for v in values)
        raise SourceError(f"{source.root}: field {name!r} (.npy) is {kinds[0]} in one sample and {kinds[-1]} in "
                          "another; one field has one dtype and trailing shape")
    shape = next(iter(shapes))
    return Field(name, "ndarray", values[0].dtype.name, shape if len(shapes) == 1 else (None, *shape[1:]))
