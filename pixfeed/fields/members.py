"""Fields as WebDataset members (layout: ``pixfeed.layouts.wds``), and back to their stored bytes.

``to_member`` turns a field's stored bytes (``pixfeed.fields.codec``) into the
member a stock WebDataset reader decodes by extension; ``from_member`` turns
a member back into those stored bytes, checking what it holds, so readers of
every format share one path from stored bytes to values.
"""
from __future__ import annotations

import io
from typing import Tuple

import numpy as np

from ..image.decode import sniff
from ..errors import CorruptDataError, SourceError
from ..layouts.wds import FIELD_EXTENSIONS
from . import Field, array, picture, scalar


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def to_member(field: Field, data: bytes, store: str, size) -> Tuple[str, bytes]:
    """(extension, member bytes) of a field's stored bytes; ``size`` (H, W) of pixels-mode records."""
    kind = field.type
    if kind == "int":
        return "cls", str(scalar.decode("int", data)).encode("ascii")
    if kind == "float":
        return "txt", repr(scalar.decode("float", data)).encode("ascii")
    if kind in ("ndarray", "boxes"):
        return "npy", _npy(array.decode(field, data))
    if kind == "mask" and store == "pixels":
        return "png", picture.encode_mask(np.frombuffer(data, np.uint8).reshape(size))
    if kind == "image":
        if store == "pixels":
            return "npy", _npy(np.frombuffer(data, np.uint8).reshape(*size, 3))
        return {"PNG": "png", "WEBP": "webp"}.get(sniff(data), "jpg"), data
    return FIELD_EXTENSIONS[kind], data


def from_member(field: Field, member: bytes, store: str, size, where: str) -> bytes:
    """A member's bytes back as the field's stored bytes; CorruptDataError names ``where`` on damage."""
    try:
        kind = field.type
        if kind in ("int", "float"):
            return scalar.encode(kind, scalar.parse(kind, member.decode("ascii"), where))
        if kind in ("ndarray", "boxes") or (kind == "image" and store == "pixels"):
            arr = np.load(io.BytesIO(member), allow_pickle=False)
            expected = (*size, 3) if kind == "image" else None
            if kind == "image" and (arr.dtype != np.uint8 or arr.shape != expected):
                raise ValueError(f"an image member of {arr.dtype} {arr.shape}, expected uint8 {expected}")
            return arr.tobytes() if kind == "image" else array.encode(field, array.parse(field, arr, where, False))
        if kind == "mask" and store == "pixels":
            arr = picture.load_mask(member, where)
            if arr.shape != tuple(size):
                raise ValueError(f"a {arr.shape} mask, expected {tuple(size)}")
            return arr.tobytes()
        return member
    except (ValueError, EOFError, OSError, UnicodeDecodeError, SourceError) as e:
        raise CorruptDataError(f"{where}: field {field.name} member cannot be read ({e})") from None
