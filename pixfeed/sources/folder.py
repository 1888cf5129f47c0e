"""Scanning a source folder into an ordered list of samples.

ImageFolder layout ``root/<class>/.../<img>``: the class is the first-level
folder and the label its index among the sorted class names.  As in
torchvision's ``find_classes``, every first-level folder is a class, one
without images too (so labels do not shift when a split lacks a class; the
manifest notes it).  A folder with
images directly in it and no class folders is *flat*: labels are -1 and
``classes`` is None.  Files and folders whose names start with "." are
skipped; symbolic links to folders are followed (as torchvision's ImageFolder
does), except a link back to a folder above it (a loop).  Samples are ordered
by relative path (sorted as strings), so the same tree always gives the same
order.  The key of a sample is its relative
path without the extension, with "/" separators.  Paths must be valid UTF-8
(keys are stored as UTF-8 text); others are refused, named.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import SourceError
from ..storage.bounded import IMAGE_BYTES, planned_size, read_file
from ..storage.store import Store, is_url, join, local_path

DEFAULT_EXTENSIONS = (".jpg", ".jpeg", ".png")
FETCH = 64  # objects fetched at once per pack task from a URL source


@dataclass
class Source:
    root: Path
    paths: List[str]          # relative paths, "/" separated, sorted
    keys: List[str]           # unique keys (relative path without extension)
    labels: np.ndarray        # int64, -1 for a flat source
    classes: Optional[List[str]]
    sizes: np.ndarray         # int64 file sizes in bytes (0 where stat failed)
    notes: List[str] = field(default_factory=list)  # for the manifest's notes
    remote: Optional[Store] = None  # set when root is a URL (then root is the URL string)
    # typed fields (pixfeed.fields), from an index file (pixfeed.sources.index); none for a folder
    schema: list = field(default_factory=list)         # [pixfeed.fields.Field]
    values: Dict[str, list] = field(default_factory=dict)  # field name -> parsed value per sample
    per_box: Tuple[str, ...] = ()                      # fields whose rows go with the boxes' rows
    blobs: Optional[list] = None                       # the images' bytes (a Parquet column), else None
    origin: dict = field(default_factory=lambda: {"kind": "folder"})  # the manifest's "source"
    walked: bool = True  # the scan walks root's folders, so a DST inside root would be scanned next time
    checked: bool = False  # the images were checked when first packed and their checksums on the way in
    checked_limit: Optional[int] = -1  # the pixel limit they were checked under (None: none; -1: not known)
    skipped: List[dict] = field(default_factory=list)  # samples the scan left out ({"path", "reason"}, on_error="skip")

    def __len__(self) -> int:
        return len(self.paths)

    def where(self, i: int) -> str:
        return str(join(self.root, self.paths[i]))

    def field_where(self, i: int, name: str) -> str:
        """Names sample ``i``'s field ``name`` in messages (an index source names its row and column)."""
        return f"{self.where(i)}, field {name}"

    def read(self, rel: str) -> bytes:
        """The bytes of a file named relative to the source (a mask or a second image); SourceError if unreadable."""
        if self.remote is not None:
            return self.remote.read(rel)
        try:
            return read_file(self.root / rel, IMAGE_BYTES, join(self.root, rel))  # a FIFO: an error, no hang
        except OSError as e:
            raise SourceError(f"{join(self.root, rel)}: cannot read ({e.strerror or e})") from None

    def fetch(self, indices) -> Iterator[Tuple[int, object]]:
        """(index, bytes) for ``indices`` in order: None (read the local file when needed) or, from a
        URL, the object's bytes fetched ``FETCH`` at a time in parallel (a StorageError where a GET failed)."""
        indices = [int(i) for i in indices]
        if self.blobs is not None:
            yield from ((i, self.blobs[i]) for i in indices)
            return
        if self.remote is None:
            yield from ((i, None) for i in indices)
            return
        for start in range(0, len(indices), FETCH):
            batch = indices[start:start + FETCH]
            yield from zip(batch, self.remote.read_many([self.paths[i] for i in batch]))


def parse_extensions(value: Optional[Sequence[str] | str]) -> tuple:
    if value is None:
        return DEFAULT_EXTENSIONS
    items = value.split(",") if isinstance(value, str) else list(value)
    exts = tuple("." + e.strip().lower().lstrip(".") for e in items if e.strip())
    if not exts:
        raise SourceError(f"--ext {value!r}: give at least one extension, e.g. jpg,png")
    return exts


def _walk(root: Path, exts: tuple) -> Tuple[List[str], np.ndarray]:
    """(image paths relative to ``root``, sorted; their sizes, 0 where stat failed)."""
    found = []

    def onerror(err: OSError) -> None:
        raise SourceError(f"{err.filename}: cannot list folder ({err.strerror})")

    ancestors = {}  # folder -> (device, inode) of it and the folders above it: a link back up is a loop
    for dirpath, dirnames, filenames in _tree(str(root), onerror):
        st, above = os.stat(dirpath), ancestors.get(os.path.dirname(dirpath), frozenset())
        if (st.st_dev, st.st_ino) in above:
            dirnames[:] = []
            continue
        ancestors[dirpath] = above | {(st.st_dev, st.st_ino)}
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            if name.startswith(".") or os.path.splitext(name)[1].lower() not in exts:
                continue
            path = name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")
            found.append((path, _size(os.path.join(dirpath, name))))  # str paths: pathlib cost more than stat
    _check_utf8(root, [p for p, _ in found])
    found.sort()
    return [p for p, _ in found], np.fromiter((n for _, n in found), np.int64, len(found))


def _tree(root: str, onerror) -> Iterator[Tuple[str, List[str], List[str]]]:
    """``os.walk(root, onerror=onerror, followlinks=True)``, top-down (the caller may prune ``dirnames``),
    with a stack instead of recursion: Python 3.11's os.walk recurses a level a folder, and a source nested
    1,200 deep raised RecursionError."""
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError as e:
            onerror(e)
            continue
        dirs, files = [], []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # links followed, as followlinks=True
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield top, dirs, files
        stack.extend(os.path.join(top, d) for d in reversed(dirs))


def _check_utf8(root: Path, paths: List[str]) -> None:
    bad = []
    for p in paths:
        try:
            p.encode("utf-8")
        except UnicodeEncodeError:
            bad.append(ascii(str(join(root, p))))
    if bad:
        raise SourceError(f"{len(bad)} file name(s) not valid UTF-8, which keys must be: {', '.join(bad[:3])}; "
                          "rename them (for example with convmv)")


def _unique_keys(paths: List[str]) -> List[str]:
    keys, seen = [], set()
    for p in paths:
        base = os.path.splitext(p)[0]
        key, n = base, 1
        while key in seen:  # a.jpg and a.png: the second becomes "a.png"-derived "a~1"
            key, n = f"{base}~{n}", n + 1
        seen.add(key)
        keys.append(key)
    return keys


def _scan_url(url: str, exts: tuple, storage_options: Optional[dict]) -> tuple:
    """(store, paths, {path: size}, first-level folders) from one recursive listing of a bucket prefix."""
    store = Store(url, storage_options)
    listing = {p: n for p, n in store.list().items() if not any(part.startswith(".") for part in p.split("/"))}
    if not listing:
        raise SourceError(f"source {store.url}: no objects under this prefix")
    paths = sorted(p for p in listing if os.path.splitext(p)[1].lower() in exts)
    _check_utf8(store.url, paths)
    return store, paths, listing, sorted({p.split("/", 1)[0] for p in listing if "/" in p})


def scan(root: str | os.PathLike, extensions=None, storage_options: Optional[dict] = None) -> Source:
    """Scan ``root`` (a folder or a URL prefix); raise SourceError if it is missing, a file, or holds no images."""
    exts = parse_extensions(extensions)
    if is_url(root):
        store, paths, listing, folders = _scan_url(root, exts, storage_options)
        root = store.url
        sizes = np.array([listing[p] for p in paths], dtype=np.int64)
    else:
        root, store = local_path(root), None
        if not root.exists():
            raise SourceError(f"source {root}: no such folder")
        if not root.is_dir():
            raise SourceError(f"source {root}: is a file, not a folder of images")
        paths, sizes = _walk(root, exts)
    if not paths:
        raise SourceError(f"source {root}: no images with extensions {', '.join(exts)} found "
                          "(hidden files and folders are skipped; use --ext for other extensions)")
    nested = [p for p in paths if "/" in p]
    if nested and len(nested) != len(paths):
        top = [p for p in paths if "/" not in p][:3]
        raise SourceError(f"source {root}: mixes class folders with images at the top level ({', '.join(top)}); "
                          "use either root/<class>/<img> or a flat folder")
    notes = []
    if nested:
        if store is None:
            with os.scandir(root) as entries:
                folders = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
        classes = folders
        _check_utf8(root, classes)
        index = {c: i for i, c in enumerate(classes)}
        labels = np.array([index[p.split("/", 1)[0]] for p in paths], dtype=np.int64)
        empty = sorted(set(classes) - {p.split("/", 1)[0] for p in paths})
        if empty:
            notes.append(f"source {root}: class folder(s) without images kept as classes, so labels match the "
                         f"folder listing: {', '.join(f'{c} (label {index[c]})' for c in empty[:10])}")
    else:
        classes, labels = None, np.full(len(paths), -1, dtype=np.int64)
    return Source(root, paths, _unique_keys(paths), labels, classes, sizes, notes, store)


def _size(path: str) -> int:
    try:
        return planned_size(os.stat(path))  # a sparse file by the blocks it holds
    except OSError:
        return 0  # reported when the file is read
