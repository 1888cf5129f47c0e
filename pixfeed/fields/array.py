"""``ndarray`` (``DTYPE[d0,...]``) and ``boxes`` fields: C-order little-endian array bytes.

The stored bytes are the array's raw bytes; the dtype and every dimension but
a variable first one (N) come from the schema.  ``boxes`` is ``float32[N,4]``
of xyxy boxes in the oriented source image's pixels; ``transform`` maps them
through the image's geometry (``pixfeed.image.geometry.Plan``).
"""
from __future__ import annotations

import json

import numpy as np

from ..errors import SourceError
from ..image.geometry import Plan, Size

DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
          "float16", "float32", "float64")


def stored_dtype(dtype: str) -> np.dtype:
    return np.dtype(dtype).newbyteorder("<")


def parse(field, value, where: str, text: bool) -> np.ndarray:
    """A cell (JSON text from CSV, a nested list, or an array) as an array of the field's dtype and shape."""
    if text:
        try:
            value = json.loads(value)
        except (TypeError, ValueError, RecursionError) as e:  # RecursionError: nested past ~1,000 levels
            raise SourceError(f"{where}: not a JSON array ({e})") from None
    try:
        arr = np.asarray(value)
        if arr.dtype == object:
            raise ValueError("ragged")
        arr = arr.astype(stored_dtype(field.dtype), casting="unsafe" if arr.dtype.kind in "biuf" else "no")
    except (TypeError, ValueError):
        raise SourceError(f"{where}: {_short(value)} is not a regular array of numbers (ragged or not numeric) "
                          f"for field {field.name} {field.spec}") from None
    expected = field.shape
    if arr.size == 0 and field.variable:
        arr = arr.reshape(0, *expected[1:])
    if arr.ndim != len(expected) or any(d is not None and d != s for d, s in zip(expected, arr.shape)):
        raise SourceError(f"{where}: an array of shape {list(arr.shape)} does not fit field {field.name} {field.spec}")
    return arr


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def encode(field, arr: np.ndarray) -> bytes:
    return np.ascontiguousarray(arr, stored_dtype(field.dtype)).tobytes()


def decode(field, data) -> np.ndarray:
    shape = tuple(-1 if d is None else d for d in field.shape)
    return np.frombuffer(data, stored_dtype(field.dtype)).reshape(shape)


def transform(boxes: np.ndarray, p: Plan, size: Size):
    """(boxes in output pixels, clipped to it, kept rows) for boxes in the plan's source pixels:
    the plan's box taken, scaled, cropped or padded, flipped; boxes left with no area are dropped."""
    H, W = size
    out = np.asarray(boxes, np.float64).reshape(-1, 4).copy()
    if p.box is not None:
        out -= [p.box[0], p.box[1], p.box[0], p.box[1]]
    (bw, bh), (sw, sh) = p.src, p.scaled
    out *= [sw / bw, sh / bh, sw / bw, sh / bh]
    ox, oy = p.offset
    sign = -1 if sw >= W and sh >= H else 1  # crop: the window starts at offset; pad: the image does
    out += sign * np.array([ox, oy, ox, oy], np.float64)
    out = np.clip(out, 0, [W, H, W, H])
    if p.flip:
        out[:, [0, 2]] = W - out[:, [2, 0]]
    keep = (out[:, 2] > out[:, 0]) & (out[:, 3] > out[:, 1])
    return out[keep].astype(np.float32), keep
