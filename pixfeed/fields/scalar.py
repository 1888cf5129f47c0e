"""``int`` and ``float`` fields: one little-endian int64 / float64 each (8 stored bytes)."""
from __future__ import annotations

import math

import numpy as np

from ..errors import SourceError

DTYPES = {"int": "<i8", "float": "<f8"}


def parse(kind: str, value, where: str):
    """A cell (text from CSV, or a typed JSON/Parquet value) as a Python int or float."""
    if isinstance(value, str):
        try:
            value = int(value) if kind == "int" else float(value)
        except ValueError:
            raise SourceError(f"{where}: {value!r} is not {'an integer' if kind == 'int' else 'a number'}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind == "int" and not _integral(value)):
        raise SourceError(f"{where}: {value!r} is not {'an integer' if kind == 'int' else 'a number'}")
    if kind == "int" and not -2**63 <= value < 2**63:
        raise SourceError(f"{where}: {value!r} does not fit in int64")
    return int(value) if kind == "int" else float(value)


def _integral(value) -> bool:
    return isinstance(value, int) or (math.isfinite(value) and value == int(value))


def encode(kind: str, value) -> bytes:
    return np.array(value, DTYPES[kind]).tobytes()


def decode(kind: str, data):
    value = np.frombuffer(data, DTYPES[kind], count=1)[0]
    return int(value) if kind == "int" else float(value)
