"""An index file as a source: one row per sample, an image column and typed fields.

``pixfeed pack --index FILE SRC DST``: FILE is CSV (or TSV), JSONL or Parquet
(``tables``).  The image column (``--image-column``, default the first of
``image``, ``path``, ``file``, ``filename``) holds paths relative to SRC (a
folder or a URL prefix), or in Parquet the image bytes themselves (a binary
column, or Hugging Face ``datasets``' Image struct ``{bytes, path}``).
SRC may be left out when the index holds every image's bytes (and no mask or
second image by path).  ``--class-column`` (default: a column named ``label``,
if any): integers (or their digits in a CSV) stay the labels as they are, -1
and null meaning unlabelled, their classes named by ``--class-names``, else by
the Parquet's Hugging Face ``ClassLabel`` names, else "0", "1", ... as for
shards' ``.cls``; any other values are class names, mapped to sorted indices
as folder names are.  Every other column is a field, its type inferred
(``infer``) unless ``--field NAME:TYPE`` gives it; a null cell is JSON null
in a json field, NaN in a float one, ``--fill NAME=VALUE`` in any, else an
error.  Keys are the image paths relative to SRC without extension (the
struct's path, or the row number, for bytes); rows whose keys repeat but
name different images are keyed ``KEY~rowN``; two rows of one file are an
error.  Every cell but pictures is parsed here, so a bad cell stops the pack
before it starts, naming the file, row and column; a missing image or mask
file is found while packing and follows ``--on-error``.  The rules:
docs/data-rules.md.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..storage.bounded import INDEX_BYTES, int64, planned_size, read_file, read_object
from ..errors import OptionError, OutsideSourceError, OverLimitError, PixfeedError, SourceError
from ..fields import Field, check_name, parse_field_option, parse_type, per_box_fields
from ..fields.codec import is_missing, parse
from .folder import Source
from ..storage.paths import outside_src
from ..storage.store import Store, is_url, local_path
from .infer import UNLABELLED, check_labels, id_classes, infer, label_int, read_class_names, unlabelled_note
from .tables import hf_class_names, read_table

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
               storage_options: Optional[dict] = None, fill: Sequence[str] = (), class_names=None,
               on_error: str = "fail", allow_outside_src: bool = False) -> IndexSource:
    data, name = _read_index(index, storage_options)
    columns, rows, is_text = read_table(Path(name), data)
    named = read_class_names(class_names)
    if not rows:
        raise SourceError(f"{name}: no rows")
    image = _image_column(name, columns, image_column)
    if class_column is None and "label" in columns:
        class_column = "label"
    given_src = src is not None
    store = Store(src, storage_options) if given_src and is_url(src) else None
    root = store.url if store else local_path(src) if given_src else _folder_of(name)
    schema = _schema(name, columns, is_text, exclude={image, class_column}, given=fields,
                     where=[f"{name}: {r}" for r in rows])
    src = IndexSource(root, [], [], np.zeros(0, np.int64), None, np.zeros(0, np.int64), remote=store)
    src.index, src.rows, src.schema = name, rows, schema
    src.paths, src.blobs = _images(name, rows, image, columns[image])
    src.walked = False  # SRC is not scanned (the index names its files), so a DST inside it is no class folder
    src.labels, src.classes = _labels(name, rows, columns, class_column, named,
                                      hf_class_names(Path(name), data).get(class_column), src.notes)
    src.per_box = per_box_fields(schema, per_box)
    filled = _fills(name, fill, schema)
    src.values = {f.name: [filled[f.name] if f.name in filled and is_missing(f, c, is_text) else
                           parse(f, c, src.field_where(i, f.name), is_text) for i, c in enumerate(columns[f.name])]
                  for f in schema}
    _check_src(name, rows, src, src_given=given_src, local=store is None)
    _check_nul(name, rows, image, src)
    src.allow_outside = allow_outside_src
    src.refused = {} if allow_outside_src else _outside(name, rows, image, src, on_error)
    src.keys = _keys(name, rows, src.paths, root if given_src and store is None else None, src.blobs is not None)
    listing = store.list() if store is not None and src.blobs is None else {}
    src.sizes = np.array([len(b) for b in src.blobs] if src.blobs is not None else
                         [listing.get(p, 0) if store else 0 if i in src.refused else _size(root / p)
                          for i, p in enumerate(src.paths)], np.int64)
    src.origin = {"kind": "index", "index": name, "image_column": image, "class_column": class_column}
    return src


def _check_nul(name: str, rows: List[str], image: str, src: IndexSource) -> None:
    """A path (image, mask, second image) holding a NUL character names no file: a SourceError naming the
    row and column, before any is opened (Python's ``open`` raises a bare ValueError on it)."""
    pictures = [f.name for f in src.schema if f.type in ("image", "mask")]
    columns = ([] if src.blobs is not None else [(image, src.paths)]) + [(f, src.values[f]) for f in pictures]
    for column, paths in columns:
        at = next((i for i, p in enumerate(paths) if isinstance(p, str) and "\0" in p), None)
        if at is not None:
            raise SourceError(f"{name}: {rows[at]}, column {column!r}: {paths[at]!r} holds a NUL character, which "
                              "no file name can")


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
            return read_object(store, name, INDEX_BYTES, f"--index {index}", "index file"), store.url_of(name)
        except OverLimitError:
            raise
        except PixfeedError as e:
            raise SourceError(f"--index {index}: cannot read ({e})") from None
    path = Path(index)
    try:  # a regular file only (a FIFO would block, /dev/zero never end), within INDEX_BYTES
        return read_file(path, INDEX_BYTES, f"--index {path}", "index file"), str(path)
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


def _keys(name: str, rows: List[str], paths: List[str], root: Optional[Path], blobs: bool) -> List[str]:
    """A key per row: its image path relative to SRC (``root``; an absolute path under it too) without
    the extension, else the path as written without a leading "/".  Rows whose keys would repeat, but
    that name different images (bytes embedded under one file name, as Hugging Face keeps only the
    basename: ``cats/000.jpg`` and ``dogs/000.jpg`` are both ``000.jpg``; or ``a.jpg`` and ``a.png``),
    are keyed ``KEY~rowN`` by their row number instead; two rows naming the same file are an error."""
    bases = [_relative(p, root) for p in paths]
    stems = [os.path.splitext(b)[0].lstrip("/") for b in bases]
    counts = Counter(stems)
    keys, first = [], {}
    for n, (row, base, key) in enumerate(zip(rows, bases, stems)):
        if counts[key] > 1:
            if not blobs and first.setdefault(os.path.normpath(base), n) != n:
                k = first[os.path.normpath(base)]
                raise SourceError(f"{name}: {row} and {rows[k]} name the same image key {key!r}: both name the "
                                  f"file {paths[n]}; each row must be a different image (merge such rows: a "
                                  f"json field holds a list)")
            key = f"{key}~row{n}"
        keys.append(key)
    return keys


def _relative(path: str, root: Optional[Path]) -> str:
    """``path`` relative to SRC (``root``) when it is absolute and under it, else as it is, "/" separated."""
    path = path.replace(os.sep, "/")
    if root is not None and os.path.isabs(path):
        normal = os.path.normpath(path)
        for folder in {os.path.abspath(root), os.path.realpath(root)}:
            if normal.startswith(folder.rstrip(os.sep) + os.sep):
                return os.path.relpath(normal, folder).replace(os.sep, "/")
    return path


def _labels(name: str, rows: List[str], columns, column: Optional[str], names: Optional[List[str]],
            class_label: Optional[List[str]], notes: List[str]) -> tuple:
    """(labels, classes) from the class column (docs/data-rules.md): integers (or their digits in text)
    stay the labels, -1 and null (an empty CSV cell) meaning unlabelled, other negatives refused; their
    classes are ``names`` (--class-names), else the Parquet's ClassLabel names, else "0".."max".  A column
    of names maps them to sorted indices, as folder names are."""
    if column is None:
        if names is not None:
            raise OptionError(f"--class-names: {name} has no class column (no column 'label'); name it with "
                              "--class-column")
        return np.full(len(rows), UNLABELLED, np.int64), None
    if column not in columns:
        raise OptionError(f"--class-column {column!r}: {name} has no such column; its columns: {', '.join(columns)}")
    cells = columns[column]
    for row, c in zip(rows, cells):
        if isinstance(c, (list, dict, bytes, bytearray)):
            raise SourceError(f"{name}: {row}, column {column!r}: {c!r} is not a class name or index")
    missing = [c is None or c == "" for c in cells]
    ids = [None if m else label_int(c) for c, m in zip(cells, missing)]
    where = lambda k: f"{name}: {rows[k]}, column {column!r}"  # noqa: E731
    for k, (i, c) in enumerate(zip(ids, cells)):  # named before any int64 array is made (#39)
        if i is not None:
            int64(i, where(k), "label")
        elif isinstance(c, float) and not math.isfinite(c):
            raise SourceError(f"{where(k)}: {c!r} is not a class name or index")
    if all(i is not None for i, m in zip(ids, missing) if not m):  # class indices: kept as they are
        labels = np.array([UNLABELLED if i is None else i for i in ids], np.int64)
        check_labels(labels, where)
        classes = id_classes(labels, names) if names is not None else \
            id_classes(labels, class_label, f"{name}: the ClassLabel names of column {column!r}")
    else:
        if names is not None:
            k = next(k for k, (i, m) in enumerate(zip(ids, missing)) if i is None and not m)
            raise OptionError(f"--class-names names integer labels, and {where(k)} holds {cells[k]!r}, a class "
                              "name: the column's names are the classes; leave --class-names out")
        unlabelled = [m or i == UNLABELLED for i, m in zip(ids, missing)]
        classes = sorted({str(c) for c, u in zip(cells, unlabelled) if not u})
        index = {c: k for k, c in enumerate(classes)}
        labels = np.array([UNLABELLED if u else index[str(c)] for c, u in zip(cells, unlabelled)], np.int64)
    note = unlabelled_note(labels, f"{name}: column {column!r}", "rows")
    if note:
        notes.append(note)
    return labels, classes


def _fills(name: str, fill: Sequence[str], schema: List[Field]) -> dict:
    """{field name: the value stored for its missing cells} from ``--fill NAME=VALUE`` (VALUE read as a
    CSV cell of the field's type: ``caption=`` is the empty text, ``n=-1``, ``tags=[]``)."""
    fields = {f.name: f for f in schema}
    out = {}
    for item in fill:
        column, _, text = item.partition("=")
        column = column.strip()
        if column not in fields:
            raise OptionError(f"--fill {item}: {name} has no field column {column!r}; its fields: "
                              f"{', '.join(fields) or 'none'}")
        out[column] = parse(fields[column], text, f"--fill {item}", True,
                            fix=f"give a value after '=' (--fill {column}=VALUE)")
    return out


def _folder_of(index: str):
    """Where an index without SRC is: its folder or URL prefix (named in messages only)."""
    return str(index).rpartition("/")[0] if is_url(index) else Path(index).parent


def _check_src(name: str, rows: List[str], src: IndexSource, src_given: bool, local: bool) -> None:
    """SRC is the folder (or URL prefix) an index's file paths are relative to: needed, and a folder,
    only when the index names a file (an image path, a mask's or second image's path)."""
    pictures = [f.name for f in src.schema if f.type in ("image", "mask")]
    paths = ((k, f) for f in pictures for k, v in enumerate(src.values[f]) if isinstance(v, str))
    first = (0, None) if src.blobs is None else next(paths, None)
    if first is None:
        return
    k, column = first
    what = f"{rows[k]} names the file {src.paths[k] if column is None else src.values[column][k]!r}"
    if not src_given:
        raise SourceError(f"{name}: {what}{'' if column is None else f' in column {column!r}'}; give SRC, the "
                          "folder (or URL prefix) the index's paths are relative to (SRC may be left out only "
                          "when the index holds every image's bytes)")
    if local and not src.root.is_dir():
        raise SourceError(f"source {src.root}: no such folder (the index's paths are relative to it: {what})")


def _size(path: Path) -> int:
    try:
        return planned_size(path.stat())  # a sparse file by the blocks it holds
    except OSError:
        return 0
