"""Field types inferred from a column's cells (``--field NAME:TYPE`` overrides them).

Integers -> ``int``; numbers -> ``float``; text -> ``str``; bytes -> ``bytes``;
numeric lists of one regular shape -> ``ndarray`` (int64, or float32 when any
element is fractional; a first dimension that varies becomes N); any other
list or object (or JSON text of one in a CSV) -> ``json``.  A CSV column that
mixes plain text with numbers is text; values of different kinds elsewhere
(a number and a text in a JSONL column, or in ``pack_samples``' dicts) are an
error naming two of them.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence

import numpy as np

from ..errors import SourceError
from ..fields import Field


def infer(name: str, cells: list, is_text: bool, where: Optional[Sequence[str]] = None) -> Field:
    """The type of column ``name`` from its cells (``where``: what names each, for errors).  Text cells
    (a CSV's) that mix plain text with numbers or JSON are text, kept as written ("001" stays "001");
    values that mix kinds (a number and a text, a text and a list) raise SourceError naming two of them."""
    kept = [(n, c) for n, c in enumerate(cells) if c is not None and (c != "" or not is_text)]
    values = [_from_text(c) if is_text else c for _, c in kept]
    kinds = [_kind(v) for v in values]
    if not values:
        return Field(name, "str")
    if len(set(kinds)) > 1:
        if is_text and "text" in kinds:
            return Field(name, "str")
        if not is_text:
            (n, a), (m, b) = kept[0], kept[next(k for k, kind in enumerate(kinds) if kind != kinds[0])]
            names = where or [f"value {k}" for k in range(len(cells))]
            raise SourceError(f"field {name!r}: its values are of different types, {a!r} in {names[n]} and "
                              f"{b!r} in {names[m]}; give every sample one type, or name the type "
                              f"(--field {name}:TYPE, schema={{{name!r}: TYPE}}; json holds any)")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return Field(name, "int")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return Field(name, "float")
    if all(isinstance(v, str) for v in values):
        return Field(name, "str")
    if all(isinstance(v, (bytes, bytearray)) for v in values):
        return Field(name, "bytes")
    if all(isinstance(v, list) for v in values):
        return _array(name, values) or Field(name, "json")
    return Field(name, "json")


def class_index(value) -> Optional[int]:
    """``value`` as a class index: an int >= 0 (NumPy's too, not a bool), else None."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def index_classes(ids) -> Optional[list]:
    """The class names of labels that are class indices already (``.cls`` members, an index's integer
    class column, ``pack_samples``' int labels): "0", "1", ... up to the largest, while they stay dense
    (the largest under max(1024, twice the distinct ids)); None for sparse ids such as 10**9."""
    ids = np.asarray(ids, np.int64)
    ids = ids[ids >= 0]
    if not len(ids) or int(ids.max()) >= max(1024, 2 * len(np.unique(ids))):
        return None
    return [str(c) for c in range(int(ids.max()) + 1)]


def _kind(value) -> str:
    """What a value is, for telling a column of one type from a mix: a number (int and float mix), a
    text, bytes, a truth value, or JSON (a list or an object)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    return "json"


def _from_text(cell: str):
    """A CSV cell as the value it spells: an int, a float, a JSON list or object, else the text."""
    for parse in (int, float):
        try:
            return parse(cell)
        except ValueError:
            pass
    if cell[:1] in "[{":
        try:
            return json.loads(cell)
        except ValueError:
            pass
    return cell


def _array(name: str, values: list) -> Optional[Field]:
    shapes, dtypes = set(), set()
    for v in values:
        try:
            arr = np.asarray(v)
        except ValueError:
            return None
        if arr.dtype.kind not in "biuf" and arr.size:
            return None
        if arr.size:
            shapes.add(arr.shape)
            dtypes.add(arr.dtype.kind)
    if not shapes or len({len(s) for s in shapes}) != 1 or len({s[1:] for s in shapes}) != 1:
        return None
    first = next(iter(shapes))
    fixed = len(shapes) == 1 and all(len(v) for v in values)
    shape = first if fixed else (None, *first[1:])
    dtype = "float32" if "f" in dtypes else "bool" if dtypes == {"b"} else "int64"
    return Field(name, "ndarray", dtype, tuple(shape))
