"""A node-local cache of remote datasets, for formats that need random access
(mmap, LMDB, HDF5 map their files; WebDataset streams instead).

Layout under ``cache_dir`` (default ``$PIXFEED_CACHE`` or ``~/.cache/pixfeed``)::

    NAME-KEY/            a copy of one remote dataset; KEY hashes its URL and manifest,
                         so a changed remote dataset never meets a stale copy
    NAME-KEY/pixfeed.json  written last: the copy is complete
    NAME-KEY.lock        held exclusively while downloading (others wait, then reuse)
    NAME-KEY.use         held shared while a process uses the copy (eviction skips it)

Files are fetched as parallel ranged GETs into ``FILE.part``, checked against
the manifest's size and xxh3_64, and only then renamed to ``FILE``: an
interrupted download resumes from the files already finished, and a file that
fails its hash is deleted and named in a CorruptDataError.  ``cache_limit``
(bytes) evicts whole least-recently-used copies that no process holds.

The cache is this user's alone (docs/untrusted-data.md): its folders are
created 0700, and an existing ``cache_dir`` must be a real folder owned by the
user and writable by nobody else (``UnsafeCacheError`` otherwise); every file
is opened with ``O_NOFOLLOW`` and a symbolic link anywhere in a copy is
refused; eviction never follows a link.  Each time a copy is reused, every
file is checked to be a regular file of the manifest's size, and every file
but the large data file (``LARGE_FILES``, whose records carry their own checked
checksums) against the manifest's xxh3_64; a file that fails is removed and
fetched again.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Optional

import xxhash

from ..checksum import file_hash
from ..errors import CorruptDataError, DatasetNotFoundError
from ..manifest import MANIFEST_NAME, write_json_atomic
from .paths import check_no_links, make_private_dir, open_nofollow
from .store import Store

LARGE_FILES = ("images.npy", "data.bin", "data.h5", "data.mdb")  # large; their records' checksums are checked on read

CHUNK = 16 << 20      # bytes per ranged GET
PARALLEL = 16         # GETs in flight
_HELD: dict = {}      # copy folder -> open .use file (a shared lock for this process's lifetime)
atexit.register(lambda: [f.close() for f in _HELD.values()])


def default_dir() -> Path:
    return Path(os.environ.get("PIXFEED_CACHE") or Path.home() / ".cache" / "pixfeed")


def stage(url: str, manifest: dict, storage_options: Optional[dict] = None, cache_dir=None,
          cache_limit: Optional[int] = None) -> Path:
    """A verified local copy of the dataset at ``url``; downloaded once per node."""
    store = Store(url, storage_options)
    base = Path(cache_dir) if cache_dir is not None else default_dir()
    make_private_dir(base)
    key = xxhash.xxh3_64_hexdigest((store.url + "\0" + json.dumps(manifest, sort_keys=True)).encode())
    folder = base / f"{store.url.rsplit('/', 1)[-1] or 'dataset'}-{key}"
    _hold(folder)
    with _open_lock(folder.with_name(folder.name + ".lock")) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        make_private_dir(folder, base)
        if not _drop_bad(folder, manifest):
            _download(store, manifest, folder)
            write_json_atomic(folder / MANIFEST_NAME, manifest)
    os.utime(folder / MANIFEST_NAME)  # least recently used = oldest manifest time
    if cache_limit is not None:
        evict(base, cache_limit)
    return folder


def _open_lock(path: Path):
    """A lock file of the cache, opened for flock (created if missing), never through a link."""
    return open(open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a")


def _drop_bad(folder: Path, manifest: dict) -> bool:
    """Check the copy in ``folder`` against ``manifest``: remove every file that is a link, not a regular
    file of its size or (but the large data files) not of its xxh3_64, and the copy's manifest with it;
    True when the copy is complete and every file passed."""
    whole = True
    for name, meta in manifest["files"].items():
        path = folder / name
        check_no_links(folder, str(PurePosixPath(name).parent))
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            whole = False
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size != meta["bytes"] or \
                (PurePosixPath(name).name not in LARGE_FILES and file_hash(path) != meta["xxh3_64"]):
            path.unlink()
            whole = False
    done = folder / MANIFEST_NAME
    if os.path.lexists(done) and (not whole or not done.is_file() or done.is_symlink()):
        done.unlink()
    return whole and done.is_file()


def _hold(folder: Path) -> None:
    if folder not in _HELD:
        f = _open_lock(folder.with_name(folder.name + ".use"))
        fcntl.flock(f, fcntl.LOCK_SH)
        _HELD[folder] = f


def _download(store: Store, manifest: dict, folder: Path) -> None:
    remote = store.list()
    todo = []
    for name, meta in manifest["files"].items():
        if os.path.lexists(folder / name):
            continue  # finished and verified by an earlier, interrupted run (checked again by _drop_bad)
        if name not in remote:
            raise DatasetNotFoundError(f"{store.url_of(name)}: data file missing from the dataset {store.url}")
        if remote[name] != meta["bytes"]:
            raise CorruptDataError(f"{store.url_of(name)}: {remote[name]} bytes, but the manifest records "
                                   f"{meta['bytes']}; the object is truncated or damaged")
        todo.append(name)
    ranges = [(name, start) for name in todo for start in range(0, max(manifest["files"][name]["bytes"], 1), CHUNK)]
    for name in todo:
        part = _part(folder, name)
        check_no_links(folder, name)
        part.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        check_no_links(folder, name)
        with open(open_nofollow(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            f.truncate(manifest["files"][name]["bytes"])
    with ThreadPoolExecutor(PARALLEL) as pool:
        list(pool.map(lambda r: _fetch(store, folder, manifest, *r), ranges))
    for name in todo:
        _finish(store, folder, name, manifest["files"][name])


def _part(folder: Path, name: str) -> Path:
    return folder / f"{name}.part"


def _fetch(store: Store, folder: Path, manifest: dict, name: str, start: int) -> None:
    end = min(start + CHUNK, manifest["files"][name]["bytes"])
    if end <= start:
        return
    data = store.read_range(name, start, end)
    fd = open_nofollow(_part(folder, name), os.O_WRONLY)
    try:
        os.pwrite(fd, data, start)
    finally:
        os.close(fd)


def _finish(store: Store, folder: Path, name: str, meta: dict) -> None:
    part = _part(folder, name)
    if os.lstat(part).st_size != meta["bytes"] or file_hash(part) != meta["xxh3_64"]:
        part.unlink()
        raise CorruptDataError(f"{store.url_of(name)}: downloaded bytes fail the manifest's xxh3_64 "
                               f"{meta['xxh3_64']} (damaged object); run 'pixfeed verify {store.url}'")
    os.replace(part, folder / name)


def evict(base: Path, limit: int) -> None:
    """Remove least-recently-used complete copies no process holds until the cache is within ``limit`` bytes."""
    copies = sorted((p for p in base.iterdir() if _a_copy(p)), key=lambda p: (p / MANIFEST_NAME).stat().st_mtime)
    total = sum(_size(p) for p in copies)
    for folder in copies:
        if total <= limit:
            return
        with _open_lock(folder.with_name(folder.name + ".use")) as use:
            try:
                fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use by some process (this one included)
            size = _size(folder)
            (folder / MANIFEST_NAME).unlink()
            shutil.rmtree(folder, ignore_errors=True)
            total -= size


def _a_copy(p: Path) -> bool:
    """Whether ``p`` is a complete copy that eviction may remove: a real folder of this user's (not a
    link: eviction through a planted link would delete its target) holding a real manifest."""
    try:
        st, done = os.lstat(p), os.lstat(p / MANIFEST_NAME)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_ISREG(done.st_mode)


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(folder):  # links are not followed
        for name in names:
            try:
                st = os.lstat(os.path.join(dirpath, name))
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
            except FileNotFoundError:
                pass  # a chunk of a chunk cache evicted or renamed meanwhile (pixfeed.storage.chunkcache)
    return total
