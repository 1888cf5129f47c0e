"""Checksums of stored bytes: xxh3-64, about 30 GB/s on one core.

Records carry ``xxh3_64`` of their stored bytes as an unsigned 64-bit integer;
whole files carry the same hash as 16 hex digits in the manifest.
"""
from __future__ import annotations

import os

import xxhash

ALGORITHM = "xxh3_64"
_CHUNK = 8 << 20


def record_hash(data) -> int:
    """xxh3-64 of a bytes-like object (bytes, memoryview, C-contiguous array)."""
    return xxhash.xxh3_64_intdigest(data)


def file_hash(path: str | os.PathLike) -> str:
    """xxh3-64 of a whole file, as 16 hex digits."""
    with open(path, "rb") as f:
        return stream_hash(f)


def stream_hash(f) -> str:
    """xxh3-64 of what is left in a binary file object, as 16 hex digits."""
    h = xxhash.xxh3_64()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()
