"""A bounded, node-shared cache of fixed-size chunks of one remote data file.

A dataset in a bucket larger than ``cache_limit`` is not copied whole: its data
file (mmap's ``images.npy`` / ``data.bin``, HDF5's ``data.h5``) is read through
``CHUNK_BYTES`` byte ranges, each fetched once per node by one ranged GET.

Layout, inside the dataset's cache folder (``pixfeed.storage.cache``'s, holding the
small files)::

    chunks/FILE.K          chunk K of FILE: bytes [K * chunk, (K + 1) * chunk), complete and verified
    chunks/.FILE.K.PID.TID a chunk being written (its full size reserved up front), renamed when verified
    chunks/FILE.K.lock     held (flock) while chunk K is fetched: the other processes wait, then reuse it
    chunks/FILE.K.failed   the error of a fetch that gave up: for ``timeout`` seconds others raise it at once
    chunks.lock            held while room is made and while a reservation is renamed to its chunk: a
                           listing under it sees each in-flight chunk once, so they stay within the limit

* Every process of the node (ranks, their DataLoader workers, the fetch
  thread) shares the folder.  A chunk appears only by ``rename`` after its
  bytes matched their xxh3_64 (the list from ``pixfeed.storage.chunked``): a reader
  never sees a partial or unverified chunk, and a chunk unlinked by eviction
  stays readable to a reader that had opened it.
* Room: before a GET, the writer reserves the chunk's size under
  ``chunks.lock``, evicting complete chunks until chunks plus reservations fit
  ``limit``; the caller orders the victims (the fetcher: furthest next use in
  the epoch's order, ``loaders/fetcher.py``; a reader: oldest first).
* Faults: transient errors are retried with backoff (counted in ``stats``)
  until ``timeout`` seconds have passed, then StorageError names the URL and
  the chunk; a missing object or refused credentials are not retried; a chunk
  failing its hash is fetched once more, then CorruptDataError.  A failed
  write (a full disk) removes its reservation and raises OutputError.
"""
from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, List, Optional

from . import chunkio
from ..errors import OutputError, PixfeedError, StorageError
from .paths import make_private_dir, open_nofollow
from .store import Store

CHUNK_BYTES = 16 << 20  # ~0.2 s of one S3 stream: the request latency is <20% of a GET; ~12k chunks for 200 GB
TIMEOUT = 60.0          # seconds a chunk may keep failing before StorageError
Victims = Callable[[List[int]], List[int]]  # present chunks -> the order to evict them in


class ChunkCache:
    """Chunks of ``name`` (``size`` bytes) of ``store``, in ``folder``, at most ``limit`` bytes of them."""

    def __init__(self, store: Store, name: str, size: int, folder: Path, chunk: int, limit: int,
                 timeout: float = TIMEOUT) -> None:
        self.store, self.name, self.size, self.chunk, self.limit, self.timeout = store, name, size, chunk, limit, timeout
        self.folder = Path(folder) / "chunks"
        make_private_dir(self.folder, Path(folder))  # 0700, not a link (docs/untrusted-data.md)
        self.hashes: List[str] = []  # one xxh3_64 per ``part`` bytes, set by pixfeed.storage.chunked
        self.part = chunk  # the bytes each hash covers: the chunk, a divisor of it, or 0 (not checked per chunk)
        self.stats: Counter = Counter()  # this process: gets, bytes, retries, refetches, evicted
        self.policy: Optional[Victims] = None  # this process's fetcher's eviction order, for its readers too

    def __getstate__(self) -> dict:
        return {**self.__dict__, "stats": Counter(), "policy": None}

    @property
    def count(self) -> int:
        return -(-self.size // self.chunk)

    def span(self, k: int) -> tuple:
        return k * self.chunk, min((k + 1) * self.chunk, self.size)

    def path(self, k: int) -> Path:
        return self.folder / f"{self.name}.{k}"

    def present(self) -> List[int]:
        prefix = self.name + "."
        return [int(e.name[len(prefix):]) for e in os.scandir(self.folder)
                if e.name.startswith(prefix) and e.name[len(prefix):].isdigit()]

    def open(self, k: int) -> int:
        """A read-only descriptor of chunk ``k``, fetched first if no process of the node has it."""
        while True:
            try:
                return open_nofollow(self.path(k), os.O_RDONLY)
            except FileNotFoundError:
                self.fetch(k, self.policy or (lambda ks: chunkio.oldest_first(ks, self.folder, self.name)))

    def fetch(self, k: int, victims: Victims, evictable: Optional[Callable[[int], bool]] = None) -> bool:
        """Bring chunk ``k`` in (False: room would evict a chunk ``evictable`` protects)."""
        with chunkio.flock(self.folder / f"{self.name}.{k}.lock"):
            if self.path(k).exists():
                return True
            self._raise_recent_failure(k)
            tmp = self._reserve(k, victims, evictable)
            if tmp is None:
                return False
            try:
                data = chunkio.verified(self, k)
                chunkio.write_all(tmp, data)
                with chunkio.flock(self.folder.parent / "chunks.lock"):  # a listing in _reserve never sees
                    os.replace(tmp, self.path(k))  # the reservation renamed away and its chunk not yet there
            except StorageError as e:
                tmp.unlink(missing_ok=True)
                with open(open_nofollow(self._failed(k), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
                    f.write(str(e))
                raise
            except OSError as e:
                tmp.unlink(missing_ok=True)
                if isinstance(e, PixfeedError):
                    raise
                raise OutputError(f"{self.folder}: cannot write chunk {k} of {self.store.url_of(self.name)} "
                                  f"({e.strerror or e}); nothing partial was kept") from None
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return True

    def _failed(self, k: int) -> Path:
        return self.folder / f"{self.name}.{k}.failed"

    def _raise_recent_failure(self, k: int) -> None:
        """A process of the node gave up on chunk ``k`` less than ``timeout`` ago: its error, not another wait."""
        try:
            if time.time() - os.lstat(self._failed(k)).st_mtime < self.timeout:
                with open(open_nofollow(self._failed(k), os.O_RDONLY)) as f:
                    raise StorageError(f.read(4096))
            self._failed(k).unlink()
        except FileNotFoundError:
            pass

    def _reserve(self, k: int, victims: Victims, evictable) -> Optional[Path]:
        start, end = self.span(k)
        with chunkio.flock(self.folder.parent / "chunks.lock"):
            used = chunkio.held(self.folder)
            total = sum(used.values())
            for v in victims(self.present()):
                if total + (end - start) <= self.limit:
                    break
                if evictable is not None and not evictable(v):
                    return None
                self.path(v).unlink(missing_ok=True)
                total -= used.get(self.path(v).name, 0)
                self.stats["evicted"] += 1
            tmp = self.folder / f".{self.name}.{k}.{os.getpid()}.{threading.get_ident()}"
            with open(open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb") as f:
                f.truncate(end - start)
        return tmp

    def drop(self, start: int, end: int) -> None:
        """Remove the chunks holding bytes ``start`` to ``end`` (a reader found them failing its own check: the
        next read fetches them again)."""
        for k in range(start // self.chunk, -(-end // self.chunk)):
            self.path(k).unlink(missing_ok=True)
        self.stats["refetches"] += 1

    def get(self, k: int) -> bytes:
        """Chunk ``k``'s bytes from the bucket, retried up to ``timeout`` (unverified, not stored)."""
        return chunkio.get(self, k)
