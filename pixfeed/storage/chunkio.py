"""Chunk I/O for ``chunkcache``: the GET with retries and its hash check, whole writes, locks, folder sizes."""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import List

import xxhash

from ..errors import CorruptDataError, PixfeedError, StorageError
from .paths import open_nofollow


def verified(cache, k: int) -> bytes:
    """Chunk ``k``'s bytes, checked against its hashes: fetched once more when they fail, then CorruptDataError."""
    for _ in (0, 1):
        data = get(cache, k)
        if matches(cache, k, data):
            return data
        cache.stats["refetches"] += 1
    start, end = cache.span(k)
    raise CorruptDataError(f"{cache.store.url_of(cache.name)}: chunk {k} (bytes {start}-{end}) fails its xxh3_64 "
                           f"{','.join(expected(cache, k))} twice (damaged object or a proxy altering it); run "
                           f"'pixfeed verify {cache.store.url}'")


def expected(cache, k: int) -> List[str]:
    """The hashes of chunk ``k``'s parts (one when the parts are the chunks; none when not checked per chunk)."""
    if not cache.hashes or not cache.part:
        return []
    step = cache.chunk // cache.part
    return cache.hashes[k * step:(k + 1) * step]


def matches(cache, k: int, data) -> bool:
    """``data`` is chunk ``k`` as hashed (each ``cache.part`` bytes by its own hash), or nothing is checked."""
    want = expected(cache, k)
    view = memoryview(data)
    return not want or [xxhash.xxh3_64_hexdigest(view[i:i + cache.part])
                        for i in range(0, len(view), cache.part)] == want


def get(cache, k: int) -> bytes:
    """Chunk ``k``'s bytes from the bucket, transient errors retried with backoff up to ``cache.timeout``."""
    start, end = cache.span(k)
    what = f"{cache.store.url_of(cache.name)} chunk {k} (bytes {start}-{end})"
    deadline, delay = time.monotonic() + cache.timeout, 0.1
    while True:
        try:
            data = cache.store.read_range_within(cache.name, start, end, deadline - time.monotonic(), what)
            if len(data) != end - start:
                raise OSError(f"short read: {len(data)} of {end - start} bytes")
            cache.stats.update(gets=1, bytes=len(data))
            return data
        except PixfeedError as e:
            if not getattr(e, "transient", False):
                raise
            if time.monotonic() + delay > deadline:
                raise StorageError(f"{e}; gave up after {cache.timeout:g} s") from None
        except OSError as e:
            if time.monotonic() + delay > deadline:
                raise StorageError(f"{what}: {e}; gave up after {cache.timeout:g} s") from None
        cache.stats["retries"] += 1
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def oldest_first(chunks: List[int], folder: Path, name: str) -> List[int]:
    """A reader's eviction order without a fetcher: the chunks fetched longest ago first."""
    def age(k: int) -> float:
        try:
            return (folder / f"{name}.{k}").stat().st_mtime
        except FileNotFoundError:
            return 0.0
    return sorted(chunks, key=age)


def held(folder: Path) -> dict:
    """{name: bytes} of the chunks and reservations in ``folder`` (a chunk renamed or evicted meanwhile is skipped)."""
    out = {}
    for e in os.scandir(folder):
        if not e.name.endswith((".lock", ".failed")):
            try:
                out[e.name] = e.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
    return out


def write_all(tmp: Path, data: bytes) -> None:
    fd = open_nofollow(tmp, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


@contextlib.contextmanager
def flock(path: Path):
    with open(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
