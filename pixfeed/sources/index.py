"""An index file as a source: one row per sample, an image column and typed fields.

``pixfeed pack --index FILE SRC DST``: FILE is CSV (or TSV), JSONL or Parquet
(``tables``).  The image column (``--image-column``, default the first of
``image``, ``path``, ``file``, ``filename``) holds paths relative to SRC (a
folder or a URL prefix), or in Parquet the image bytes themselves (a binary
column, or Hugging Face ``datasets``' Image struct ``{bytes, path}``).
``--class-column`` (default: a column named ``label``, if any) maps its values
to class indices (sorted, as folder names are), except that class indices
already (every value an int >= 0, or its digits in a CSV) stay as they are,
the classes named "0", "1", ... as for shards' ``.cls``; every other column is a field, its type inferred (``infer``) unless
``--field NAME:TYPE`` gives it.  Keys are the image paths without extension
(the struct's path, or the row number, for bytes); two rows of one key are an
error.  Every cell but pictures is parsed here, so a bad cell stops the pack
before it starts, naming the file, row and column; a missing image or mask
file is found while packing and follows ``--on-error``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..errors import OptionError, OutsideSourceError, PixfeedError, SourceError
from ..fields import Field, check_name, parse_field_option, parse_type, per_box_fields
from ..fields.codec import parse
from .folder import Source
from ..storage.paths import outside_src
from ..storage.store import Store, is_url, local_path
from .infer import class_index, index_classes, infer
from .tables import read_table

IMAGE_COLUMNS = ("image", "path", "file", "filename")


class IndexSource(Source):
    """A Source whose messages name the index file's row (and column)."""
    index: str = ""
    rows: List[str] = []

    def where(self, i: int) -> str:
        return f"{self.index}: {self.rows[i]} ({self.paths[i]})"

    def field_where(self, i: int, name: str) -> str:
        return f"{self.index}: {self.rows[i]}, column {name!r}"

    refused: Dict[int, str] = {}  # rows whose image or picture path leaves SRC (--on-error skip): row -> why
    allow_outside = False         # allow_outside_src: absolute paths and paths out of SRC are read

    def fetch(self, indices):
        for i, data in super().fetch(indices):
            yield i, (OutsideSourceError(self.refused[i]) if i in self.refused else data)

    def read(self, rel: str) -> bytes:
        if not self.allow_outside and outside_src(rel):
            raise OutsideSourceError(f"{rel}: {outside_src(rel)}; {OUTSIDE_RULE}")
        return super().read(rel)


OUTSIDE_RULE = ("an index's paths are relative to SRC and stay inside it (pass --allow-outside-src, "
                "allow_outside_src=True, to read absolute paths or paths outside SRC, as Hugging Face's "
                "to_parquet writes)")


def scan_index(index, src, image_column: Optional[str] = None, fields: Sequence[str] = (),
               class_column: Optional[str] = None, per_box: Sequence[str] = (),
               storage_options: Optional[dict] = None, on_error: str = "fail",
               allow_outside_src: bool = False) -> IndexSource:
    data, name = _read_index(index, storage_options)
    columns, rows, is_text = read_table(Path(name), data)
    if not rows:
        raise SourceError(f"{name}: no rows")
    image = _image_column(name, columns, image_column)
    if class_column is None and "label" in columns:
        class_column = "label"
    store = Store(src, storage_options) if is_url(src) else None
    root = store.url if store else local_path(src)
    if store is None and not root.is_dir():
        raise SourceError(f"source {root}: no such folder (the index's image paths are relative to it)")
    schema = _schema(name, columns, is_text, exclude={image, class_column}, given=fields,
                     where=[f"{name}: {r}" for r in rows])
    src = IndexSource(root, [], [], np.zeros(0, np.int64), None, np.zeros(0, np.int64), remote=store)
    src.index, src.rows, src.schema = name, rows, schema
    src.paths, src.blobs = _images(name, rows, image, columns[image])
    src.keys = _keys(name, rows, src.paths)
    src.labels, src.classes = _labels(name, rows, columns, class_column)
    src.per_box = per_box_fields(schema, per_box)
    src.values = {f.name: [parse(f, c, src.field_where(i, f.name), is_text) for i, c in enumerate(columns[f.name])]
                  for f in schema}
    src.allow_outside = allow_outside_src
    src.refused = {} if allow_outside_src else _outside(name, rows, image, src, on_error)
    listing = store.list() if store is not None and src.blobs is None else {}
    src.sizes = np.array([len(b) for b in src.blobs] if src.blobs is not None else
                         [listing.get(p, 0) if store else 0 if i in src.refused else _size(root / p)
                          for i, p in enumerate(src.paths)], np.int64)
    src.origin = {"kind": "index", "index": name, "image_column": image, "class_column": class_column}
    return src


def _outside(name: str, rows: List[str], image: str, src: IndexSource, on_error: str) -> Dict[int, str]:
    """Rows whose image path (or a mask's or second image's) is absolute or leaves SRC, checked on the
    text before any is opened: OutsideSourceError at the first (--on-error fail), else row -> why."""
    pictures = [f.name for f in src.schema if f.type in ("image", "mask")]
    refused: Dict[int, str] = {}
    for i, row in enumerate(rows):
        cells = [] if src.blobs is not None else [(image, src.paths[i])]
        cells += [(f, src.values[f][i]) for f in pictures if isinstance(src.values[f][i], str)]
        for column, path in cells:
            why = outside_src(path)
            if why:
                refused[i] = f"{name}: {row}, column {column!r}: {path!r} {why}; {OUTSIDE_RULE}"
                if on_error == "fail":
                    raise OutsideSourceError(refused[i])
                break
    return refused


def _read_index(index, storage_options) -> tuple:
    if is_url(index):
        prefix, _, name = str(index).rstrip("/").rpartition("/")
        store = Store(prefix, storage_options)
        try:
            return store.read(name), store.url_of(name)
        except PixfeedError as e:
            raise SourceError(f"--index {index}: cannot read ({e})") from None
    path = Path(index)
    try:
        return path.read_bytes(), str(path)
    except OSError as e:
        raise SourceError(f"--index {path}: cannot read ({e.strerror or e})") from None


def _image_column(name: str, columns: Dict[str, list], given: Optional[str]) -> str:
    if given is not None:
        if given not in columns:
            raise OptionError(f"--image-column {given!r}: {name} has no such column; its columns: "
                              f"{', '.join(columns)}")
        return given
    found = next((c for c in IMAGE_COLUMNS if c in columns), None)
    if found is None:
        raise OptionError(f"{name}: no image column (none named {', '.join(IMAGE_COLUMNS)}); name it with "
                          f"--image-column, one of: {', '.join(columns)}")
    return found


def _schema(name: str, columns, is_text: bool, exclude: set, given: Sequence[str], where: List[str]) -> List[Field]:
    overrides = dict(parse_field_option(g) for g in given)
    unknown = [n for n in overrides if n not in columns]
    if unknown:
        raise OptionError(f"--field {unknown[0]}: {name} has no column {unknown[0]!r}; its columns: "
                          f"{', '.join(columns)}")
    out = []
    for column, cells in columns.items():
        if column in exclude:
            continue
        if column != "image":  # named below: a column every record has
            check_name(column, f"{name}: column", "rename the column in the index")
        out.append(parse_type(column, overrides[column], "--field") if column in overrides
                   else infer(column, cells, is_text, where))
        if out[-1].name == "image":
            raise SourceError(f"{name}: column 'image' is a name every record has and not the image column; "
                              "rename it in the index")
    return out


def _images(name: str, rows: List[str], column: str, cells: list) -> tuple:
    """(paths, blobs): paths relative to SRC, or for image bytes a name per row and the bytes."""
    hf = [c.get("bytes") if isinstance(c, dict) else c for c in cells]
    if all(isinstance(c, (bytes, bytearray)) for c in hf):
        names = [c.get("path") or row if isinstance(c, dict) else row for c, row in zip(cells, rows)]
        return [str(n) for n in names], [bytes(c) for c in hf]
    paths = [c.get("path") if isinstance(c, dict) else c for c in cells]
    for row, p in zip(rows, paths):
        if not isinstance(p, str) or not p:
            raise SourceError(f"{name}: {row}, column {column!r}: {p!r} is neither an image path nor image bytes")
        if is_url(p):
            raise SourceError(f"{name}: {row}, column {column!r}: {p} is a URL; give the URL prefix as SRC and "
                              "paths relative to it")
    return paths, None


def _keys(name: str, rows: List[str], paths: List[str]) -> List[str]:
    keys, seen = [], {}
    for row, p in zip(rows, paths):
        key = os.path.splitext(p.replace(os.sep, "/"))[0].lstrip("/")
        if key in seen:
            raise SourceError(f"{name}: {row} and {seen[key]} name the same image key {key!r} ({p}); "
                              "each row must be a different image")
        seen[key] = row
        keys.append(key)
    return keys


def _labels(name: str, rows: List[str], columns, column: Optional[str]) -> tuple:
    if column is None:
        return np.full(len(rows), -1, np.int64), None
    if column not in columns:
        raise OptionError(f"--class-column {column!r}: {name} has no such column; its columns: {', '.join(columns)}")
    cells = columns[column]
    for row, c in zip(rows, cells):
        if c is None or c == "" or isinstance(c, (list, dict)):
            raise SourceError(f"{name}: {row}, column {column!r}: {c!r} is not a class name")
    ids = [_class_id(c) for c in cells]
    names = index_classes(ids) if all(i is not None for i in ids) else None
    if names is not None:  # class indices already: kept, as .cls labels are (sparse ids are names)
        return np.array(ids, np.int64), names
    classes = sorted({str(c) for c in cells})
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index[str(c)] for c in cells], np.int64), classes


def _class_id(cell) -> Optional[int]:
    """A class column's cell as a class index (an int >= 0, or its digits in a CSV), else None."""
    if isinstance(cell, str):
        return int(cell) if cell.strip().isdigit() and cell.strip().isascii() else None
    return class_index(cell)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
