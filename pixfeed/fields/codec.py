"""One entry point per step for every field type: parse a source cell, encode it to its stored
bytes, decode stored bytes, and the fixed row (dtype, shape) formats store as one array."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ..errors import SourceError
from . import BLOBS, PICTURES, SCALARS, Field, array, scalar, text


def parse(field: Field, value, where: str, is_text: bool = False):
    """A source cell as the field's value (a path or bytes for pictures); SourceError names ``where``."""
    if value is None or (is_text and value == "" and field.type != "str"):
        raise SourceError(f"{where}: empty cell for field {field.name} ({field.spec})")
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
