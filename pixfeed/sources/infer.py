"""Field types inferred from a column's cells (``--field NAME:TYPE`` overrides them).

Integers -> ``int``; numbers -> ``float``; text -> ``str``; bytes -> ``bytes``;
numeric lists of one regular shape -> ``ndarray`` (int64, or float32 when any
element is fractional; a first dimension that varies becomes N); any other
list or object (or JSON text of one in a CSV) -> ``json``.  A CSV column that
mixes plain text with numbers is text; values of different kinds elsewhere
(a number and a text in a JSONL column, or in ``pack_samples``' dicts) are an
error naming two of them.  Null cells (None, or an empty CSV cell) do not count:
a column of nothing but nulls is ``json`` (a CSV's empty column ``str``), and
what a null is stored as follows its type (``pixfeed.fields.codec.parse``).

Labels (``check_labels``, ``id_classes``): integers are class indices, kept as
they are in every source, -1 meaning unlabelled and other negatives refused;
their classes are given names, else "0".."max" (``index_classes``).
"""
from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

import numpy as np

from ..errors import OptionError, SourceError
from ..storage.bounded import NAMES_BYTES, read_file
from ..fields import Field


def infer(name: str, cells: list, is_text: bool, where: Optional[Sequence[str]] = None) -> Field:
    """The type of column ``name`` from its cells (``where``: what names each, for errors).  Text cells
    (a CSV's) that mix plain text with numbers or JSON are text, kept as written ("001" stays "001");
    values that mix kinds (a number and a text, a text and a list) raise SourceError naming two of them."""
    kept = [(n, c) for n, c in enumerate(cells) if c is not None and (c != "" or not is_text)]
    values = [_from_text(c) if is_text else c for _, c in kept]
    kinds = [_kind(v) for v in values]
    if not values:  # every cell empty: a CSV's empty texts stay text; nulls elsewhere are JSON nulls
        return Field(name, "str" if is_text else "json")
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


UNLABELLED = -1  # the label of a sample without one: a flat folder's, Hugging Face's "no label"
LABEL_RULE = "a label is a class index (an integer >= 0) or -1 for unlabelled"


def class_index(value) -> Optional[int]:
    """``value`` as a class index: an int >= 0 (NumPy's too, not a bool), else None."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


def label_int(value) -> Optional[int]:
    """``value`` as an integer label, any sign (the caller refuses those below -1 by ``check_labels``):
    an int (NumPy's too, not a bool), or its digits in text (a CSV cell, a ``.cls`` member), else None."""
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text[:1] in "+-" else text
        if not (digits.isdigit() and digits.isascii()):
            return None
        # past int64 either way: the caller names it (Python refuses to parse over 4,300 digits)
        return int(text) if len(digits) <= 20 else (-1 if text[0] == "-" else 1) << 64
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    return None


def check_labels(ids, where) -> None:
    """Raise SourceError at the first label below -1 (``where(i)`` names sample ``i``): -1 is unlabelled,
    other negative integers are no label pixfeed can store faithfully."""
    ids = np.asarray(ids, np.int64)
    bad = np.flatnonzero(ids < UNLABELLED)
    if len(bad):
        raise SourceError(f"{where(int(bad[0]))}: label {int(ids[bad[0]])} is negative; {LABEL_RULE}, so "
                          "give the sample its class index, or -1")


def unlabelled_note(labels, what: str, unit: str = "samples") -> Optional[str]:
    """The manifest's note when some of ``labels`` (from a class column, ``.cls`` members or given
    labels: ``what``) are -1, unlabelled; None when none are."""
    labels = np.asarray(labels, np.int64)
    n = int((labels == UNLABELLED).sum())
    if not n:
        return None
    return f"{what}: {n} of {len(labels)} {unit} unlabelled (label -1: -1 or no value)"


def index_classes(ids) -> Optional[list]:
    """The class names of labels that are class indices already (``.cls`` members, an index's integer
    class column, ``pack_samples``' int labels): "0", "1", ... up to the largest, while they stay dense
    (the largest under max(1024, twice the distinct ids)); None for sparse ids such as 10**9."""
    ids = np.asarray(ids, np.int64)
    ids = ids[ids >= 0]
    if not len(ids) or int(ids.max()) >= max(1024, 2 * len(np.unique(ids))):
        return None
    return [str(c) for c in range(int(ids.max()) + 1)]


def id_classes(ids, names: Optional[Sequence[str]] = None, what: str = "--class-names") -> Optional[list]:
    """The classes of integer labels ``ids``: ``names`` (the class of label k is names[k]; every label
    must have one, ``what`` names where they came from) when given, else ``index_classes(ids)``."""
    if names is None:
        return index_classes(ids)
    ids = np.asarray(ids, np.int64)
    top = int(ids.max()) if len(ids) else UNLABELLED
    what = getattr(names, "origin", what)
    if top >= len(names):
        raise SourceError(f"{what}: {len(names)} class names, but a sample has label {top}; give a name for "
                          f"every class index from 0 to {top}")
    return [str(n) for n in names]


def read_class_names(value, what: str = "--class-names") -> Optional[List[str]]:
    """Class names from ``value``: None; a list of names; or a file, a JSON list of strings or a text
    file of one name per line (blank lines at the end ignored).  OptionError when unreadable or when
    a name repeats or is empty."""
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        try:  # a regular file only (a FIFO would block, /dev/zero never end), within NAMES_BYTES
            text = read_file(value, NAMES_BYTES, f"{what} {value}", "class names file").decode("utf-8-sig")
        except (OSError, UnicodeDecodeError) as e:
            raise OptionError(f"{what} {value}: cannot read ({getattr(e, 'strerror', None) or e})") from None
        stripped = text.strip()
        if stripped.startswith("["):
            try:
                names = json.loads(stripped)
            except ValueError as e:
                raise OptionError(f"{what} {value}: not a JSON list of names ({e})") from None
        else:
            names = [line.rstrip("\r") for line in text.rstrip("\r\n").split("\n")] if stripped else []
        what = f"{what} {value}"
    else:
        names = list(value)
    if not all(isinstance(n, str) and n for n in names):
        raise OptionError(f"{what}: each class name must be a non-empty string")
    if not names or len(set(names)) != len(names):
        dup = next((n for n in names if names.count(n) > 1), None)
        raise OptionError(f"{what}: " + (f"names {dup!r} twice; class names must differ" if dup else "no names"))
    out = ClassNames(names)
    out.origin = what
    return out


class ClassNames(list):
    """Class names read from ``origin`` (``--class-names FILE``), named in messages."""
    origin = "--class-names"


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
        except (ValueError, RecursionError):  # nested past ~1,000 levels: text, refused if typed JSON
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
