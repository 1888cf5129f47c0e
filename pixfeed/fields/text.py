"""``str``, ``json`` and ``bytes`` fields: UTF-8 text, compact JSON text (never pickle), raw bytes."""
from __future__ import annotations

import json

from ..errors import SourceError


def parse(kind: str, value, where: str, text: bool):
    """A cell as the field's value; ``text``: the cell is text to parse (CSV), not a typed value."""
    if kind == "json":
        if not text:
            return value
        try:
            return json.loads(value)
        except (TypeError, ValueError, RecursionError) as e:  # RecursionError: nested past ~1,000 levels
            raise SourceError(f"{where}: not valid JSON ({e})") from None
    if isinstance(value, (bytes, bytearray, memoryview)):
        if kind == "bytes":
            return bytes(value)
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SourceError(f"{where}: not valid UTF-8 text ({e.reason} at byte {e.start})") from None
    if not isinstance(value, str):
        raise SourceError(f"{where}: {value!r} is not a string" + (" (use --field NAME:json for JSON values)"
                                                                   if kind == "str" else ""))
    return value.encode("utf-8") if kind == "bytes" else value


def encode(kind: str, value) -> bytes:
    if kind == "json":
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    return value.encode("utf-8") if kind == "str" else bytes(value)


def decode(kind: str, data):
    data = bytes(data)
    if kind == "bytes":
        return data
    text = data.decode("utf-8")
    return json.loads(text) if kind == "json" else text
