"""One entry point per step for every field type: parse a source cell, encode it to its stored
bytes, decode stored bytes, and the fixed row (dtype, shape) formats store as one array.

Missing values (a null cell, an empty CSV cell outside a ``str`` column): a ``json`` field stores
JSON null, a ``float`` field NaN; the other types have no missing value, so such a cell is an
error unless the source fills it (an index's ``--fill NAME=VALUE``; docs/data-rules.md)."""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from ..errors import SourceError
from . import BLOBS, PICTURES, SCALARS, Field, array, scalar, text


def is_missing(field: Field, value, is_text: bool = False) -> bool:
    """Whether a cell holds no value: None (JSON/Parquet null), or an empty CSV cell (except in a
    ``str`` column, where it is the empty text)."""
    return value is None or (is_text and value == "" and field.type != "str")


def missing_fix(name: str) -> str:
    """How to proceed past a null of field ``name`` in an index file (``pack --index``)."""
    return (f"give the row a value, fill the column's nulls with --fill {name}=VALUE (fill={{{name!r}: VALUE}}), "
            f"or keep them as JSON null with --field {name}:json")


def parse(field: Field, value, where: str, is_text: bool = False, fix: Optional[str] = None):
    """A source cell as the field's value (a path or bytes for pictures); SourceError names ``where``.
    A missing cell (``is_missing``) is null in a ``json`` field and NaN in a ``float`` field; in any other
    field it has no stored form, and the error says how to proceed (``fix``, default ``missing_fix``)."""
    if is_missing(field, value, is_text):
        if field.type == "json":
            return None
        if field.type == "float":
            return math.nan
        raise SourceError(f"{where}: {'null' if value is None else 'empty cell'} for field {field.name} "
                          f"({field.spec}), which has no missing value; {fix or missing_fix(field.name)}")
    if field.type in SCALARS:
        return scalar.parse(field.type, value, where)
    if field.type in BLOBS:
        return text.parse(field.type, value, where, is_text)
    if field.type in PICTURES:
        if isinstance(value, dict) and ("bytes" in value or "path" in value):  # Hugging Face's Image feature
            value = value.get("bytes") or value.get("path")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if not isinstance(value, str) or not value:
            raise SourceError(f"{where}: {value!r} is neither a file path nor image bytes")
        return value
    return array.parse(field, value, where, is_text)


def encode(field: Field, value) -> bytes:
    if field.type in SCALARS:
        return scalar.encode(field.type, value)
    if field.type in BLOBS:
        return text.encode(field.type, value)
    return array.encode(field, value)


def decode(field: Field, data):
    """Stored bytes as the value a reader returns: int, float, str, JSON value, bytes or a tensor."""
    import torch

    if field.type in SCALARS:
        return scalar.decode(field.type, data)
    if field.type in BLOBS:
        return text.decode(field.type, data)
    return torch.from_numpy(array.decode(field, data).copy())


def fixed_row(field: Field, store: str, size) -> Optional[Tuple[np.dtype, tuple]]:
    """(dtype, shape) when every record's value has one shape (stored as one N x shape array), else None."""
    if field.type in SCALARS:
        return np.dtype(scalar.DTYPES[field.type]), ()
    if field.type in PICTURES:
        return (np.dtype(np.uint8), (*size, 3) if field.type == "image" else tuple(size)) if store == "pixels" else None
    if field.type == "ndarray" and not field.variable:
        return array.stored_dtype(field.dtype), tuple(field.shape)
    return None


def column(values: list):
    """Values of one field across a batch: tensors of one shape stacked, ints, floats and bools as a
    tensor, anything else (text, JSON values, bytes, arrays of differing shapes) a list."""
    import torch

    head = values[0]
    if isinstance(head, torch.Tensor):
        same = all(isinstance(v, torch.Tensor) and v.shape == head.shape for v in values)
        return torch.stack(values) if same else list(values)
    if all(type(v) is type(head) for v in values) and type(head) in (int, float, bool):
        return torch.tensor(values)
    return list(values)
