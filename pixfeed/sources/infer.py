"""Field types inferred from a column's cells (``--field NAME:TYPE`` overrides them).

Integers -> ``int``; numbers -> ``float``; text -> ``str``; bytes -> ``bytes``;
numeric lists of one regular shape -> ``ndarray`` (int64, or float32 when any
element is fractional; a first dimension that varies becomes N); any other
list or object (or JSON text of one in a CSV) -> ``json``.
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np

from ..fields import Field


def infer(name: str, cells: list, is_text: bool) -> Field:
    values = [c for c in cells if c is not None and c != ""] if is_text else [c for c in cells if c is not None]
    if is_text:
        values = [_from_text(v) for v in values]
    if not values:
        return Field(name, "str")
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
