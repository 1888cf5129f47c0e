"""Opening a bucket dataset through the chunk cache, and the per-chunk hash list.

``open_remote`` decides, for a map-style dataset at a URL:

* the mmap format (both store modes) and HDF5, with ``cache_limit`` smaller
  than the dataset: the small files (manifest, labels, checksums, offsets,
  keys) are staged whole (``pixfeed.storage.cache``) and the one data file is read
  through a ``ChunkCache`` in the same folder;
* otherwise (no limit, the dataset fits in it, or LMDB, whose reader maps its
  file and cannot read it through ranges) the whole dataset is staged as before.

Chunk hashes: the packer writes ``"chunks": {"bytes": CHUNK_BYTES,
"xxh3_64": {data file: [16 hex digits per chunk]}}`` into the manifest
(``manifest_entry``).  A cache whose chunk size is that size, or a multiple of
it, checks each fetched chunk by the stored hashes of the parts it covers
(``cache.part``).  Any other chunk size (smaller ones, the advice for a full
shuffle) checks nothing per chunk when the reader declares ``checked``: it
checks every byte it takes from the data file itself (the mmap reader with
record checksums on: each record's own xxh3_64, the ``.npy`` header against
the manifest), so no chunk size reads the file before the first batch.  A
reader that cannot (HDF5, whose metadata and labels live in ``data.h5``;
``checksums=False``), and a pack without the entry (older pixfeed), gets the
list computed on first use: one pass of parallel ranged GETs over the file,
checked against the manifest's whole-file xxh3_64, kept as
``chunks-BYTES.json`` beside the chunks (once per node, under a lock).
"""
from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional, Tuple

from .cache import stage
from ..checksum import FileHasher
from .chunkcache import CHUNK_BYTES, TIMEOUT, ChunkCache
from .chunkio import flock
from ..errors import CorruptDataError, DatasetNotFoundError, OptionError
from ..manifest import write_json_atomic
from .paths import open_nofollow
from .store import Store

DATA_FILES = {"mmap": ("images.npy", "data.bin"), "hdf5": ("data.h5",)}
PARALLEL = 8  # chunk GETs in flight while hashing a file
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_bytes(value, name: str = "cache_limit") -> Optional[int]:
    """An int, or a text like "200GB" / "512MiB" (decimal or binary units), as bytes."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", value.lower()) if isinstance(value, str) else None
    if not m:
        raise OptionError(f"{name}={value!r}: expected bytes, e.g. 200_000_000_000, '200GB' or '512MiB'")
    unit = _UNITS[m.group(2) or ""]
    return int(float(m.group(1)) * unit)


def data_file(manifest: dict) -> Optional[str]:
    return next((n for n in DATA_FILES.get(manifest["format"], ()) if n in manifest["files"]), None)


def open_remote(url: str, manifest: dict, storage_options: Optional[dict], cache_dir, cache_limit,
                chunk_bytes: Optional[int] = None, timeout: float = TIMEOUT,
                checked: bool = False) -> Tuple[Path, Optional[ChunkCache]]:
    """(local folder, chunk cache or None): see the module's docstring.  ``checked``: the reader checks every
    byte it takes from the data file (record checksums), so chunks of an unlisted size need no hash list."""
    limit, name = parse_bytes(cache_limit), data_file(manifest)
    total = sum(meta["bytes"] for meta in manifest["files"].values())
    if limit is None or total <= limit or name is None:
        return stage(url, manifest, storage_options, cache_dir, limit), None
    chunk = parse_bytes(chunk_bytes, "chunk_bytes") or CHUNK_BYTES
    if limit < 2 * chunk:
        raise OptionError(f"cache_limit={cache_limit!r}: a chunk cache needs room for at least two chunks of "
                          f"{chunk:,} bytes; raise cache_limit or lower chunk_bytes")
    listed = Store(url, storage_options).list().get(name)
    if listed != manifest["files"][name]["bytes"]:
        raise (DatasetNotFoundError if listed is None else CorruptDataError)(
            f"{url.rstrip('/')}/{name}: " + ("data file missing from the dataset" if listed is None else
                                            f"{listed} bytes, but the manifest records {manifest['files'][name]['bytes']}"))
    small = {**manifest, "files": {n: m for n, m in manifest["files"].items() if n != name}, "chunked": name}
    folder = stage(url, small, storage_options, cache_dir, None)
    cache = ChunkCache(Store(url, storage_options), name, manifest["files"][name]["bytes"], folder, chunk,
                       limit - sum(m["bytes"] for m in small["files"].values()), timeout)
    cache.hashes = chunk_hashes(cache, manifest, checked)
    return folder, cache


def chunk_hashes(cache: ChunkCache, manifest: dict, checked: bool = False) -> List[str]:
    """The hashes ``cache`` checks its chunks by (sets ``cache.part``, the bytes each covers); [] when the
    reader checks the bytes itself (``checked``) and the manifest lists no hashes a chunk can be checked by."""
    entry = manifest.get("chunks") or {}
    stored, listed = entry.get("bytes"), entry.get("xxh3_64", {}).get(cache.name)
    if listed is not None and isinstance(stored, int) and stored > 0 and cache.chunk % stored == 0:
        cache.part = stored  # a chunk of k stored parts: checked part by part, no pass
        return list(listed)
    if checked and listed is not None:
        cache.part = 0  # nothing per chunk: every record is checked by its own xxh3_64
        return []
    path = cache.folder.parent / f"chunks-{cache.chunk}.json"
    with flock(cache.folder.parent / "chunks-hash.lock"):
        if not path.is_file():
            write_json_atomic(path, _hash_remote(cache, manifest["files"][cache.name]["xxh3_64"]))
        with open(open_nofollow(path, os.O_RDONLY)) as f:  # the cache's own file, never through a link
            return json.loads(f.read())


def _hash_remote(cache: ChunkCache, whole: str) -> List[str]:
    """Every chunk's xxh3_64, fetched PARALLEL at a time (not stored), checked against the file's own hash."""
    hasher = FileHasher(cache.chunk)
    with ThreadPoolExecutor(PARALLEL) as pool:
        for first in range(0, cache.count, PARALLEL):
            for data in pool.map(cache.get, range(first, min(first + PARALLEL, cache.count))):
                hasher.update(data)
    total, out = hasher.result()
    if total != whole:
        raise CorruptDataError(f"{cache.store.url_of(cache.name)}: its bytes fail the manifest's xxh3_64 {whole} "
                               f"(damaged object); run 'pixfeed verify {cache.store.url}'")
    return out


def manifest_entry(folder: Path, format_name: str, chunk: int = CHUNK_BYTES, whole: Optional[dict] = None,
                   known: Optional[dict] = None) -> dict:
    """The packer's ``chunks`` manifest entry for a finished pack in ``folder`` ({} for other formats).
    ``whole``, a dict, receives each data file's own xxh3_64, hashed in the same pass (one read);
    ``known``: {file: (its hash, its chunks' hashes)} already hashed by the writer (not read again)."""
    hashes = {}
    for name in DATA_FILES.get(format_name, ()):
        if name in (known or {}):
            total, hashes[name] = known[name]
        elif (folder / name).is_file():
            hasher = FileHasher(chunk)
            with open(folder / name, "rb") as f:
                hasher.feed(f.fileno(), 0, os.fstat(f.fileno()).st_size)
            total, hashes[name] = hasher.result()
        else:
            continue
        if whole is not None:
            whole[name] = total
    return {"chunks": {"bytes": chunk, "xxh3_64": hashes}} if hashes else {}
