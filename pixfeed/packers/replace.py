"""What ``--overwrite`` may replace (docs/untrusted-data.md).

Only what is verifiably a pixfeed dataset: a ``pixfeed.json`` that is a valid
manifest, every file it lists present, and nothing else in the folder (or
under the bucket prefix) but those files, the folders that hold them and the
manifest.  A folder with any other file (notes, checkpoints, a stray
``pixfeed.json`` of ``{}``) is refused untouched, naming the first file at
fault; so is a dataset folder that holds the pack's source (SRC, or the index
file), since replacing it would delete what is being packed.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import platform
import stat
import sys
from pathlib import Path
from typing import Dict, Iterable, Optional

import xxhash

from ..errors import DatasetError, DestinationChangedError, OverwriteRefusedError, PixfeedError, UnsafeCacheError
from ..manifest import MANIFEST_NAME, parse_manifest, write_json_atomic
from ..storage.cache import default_dir
from ..storage.bounded import MANIFEST_BYTES, read_open
from ..storage.paths import make_private_dir, open_inside, remove_tree
from . import interrupt

log = logging.getLogger(__name__)

RULE = ("--overwrite only replaces pixfeed datasets (a valid pixfeed.json, every file it lists present, nothing "
        "else) and empty folders, so nothing was touched: choose another DST or remove it yourself")


def not_a_dataset(manifest: Optional[bytes], present: Iterable[str], allowed: Iterable[str] = ()) -> Optional[str]:
    """Why a folder (or bucket prefix) holding the files ``present`` (relative paths, the manifest's text
    ``manifest``, None when it has none) is not a dataset that --overwrite may replace; None if it is.
    ``allowed``: other names it may hold (a killed bucket pack's marker)."""
    if manifest is None:
        return f"a folder that is not a pixfeed dataset (no {MANIFEST_NAME})"
    try:
        m = parse_manifest(manifest, MANIFEST_NAME)
    except DatasetError as e:
        return f"not a pixfeed dataset (its {MANIFEST_NAME} is not a valid manifest: {e})"
    present = set(present) - {MANIFEST_NAME, *allowed}
    expected = set(m["files"]) | {s["name"] for s in m.get("shards") or () if isinstance(s, dict)}
    missing = sorted(expected - present)
    if missing:
        return f"not a whole pixfeed dataset ({missing[0]}, listed in its {MANIFEST_NAME}, is missing)"
    extra = sorted(present - expected)
    if extra:
        return f"not only a pixfeed dataset (it also holds {extra[0]}, which its {MANIFEST_NAME} does not list)"
    return None


def local_files(folder: Path) -> Dict[str, bool]:
    """{relative path: whether it is a folder} of everything under ``folder``; links are not followed
    (a link is an entry, as a file is)."""
    out: Dict[str, bool] = {}
    todo = [Path(folder)]
    while todo:
        here = todo.pop()
        with os.scandir(here) as entries:
            for e in entries:
                rel = Path(e.path).relative_to(folder).as_posix()
                is_dir = e.is_dir(follow_symlinks=False)
                out[rel] = is_dir
                if is_dir:
                    todo.append(Path(e.path))
    return out


def _manifest_text(dst: Path) -> Optional[bytes]:
    """The bytes of ``dst``'s own manifest, read within MANIFEST_BYTES from the file opened (no link
    followed, no FIFO opened); None where there is none such (a link, a special file, one too large)."""
    try:
        return read_open(open_inside(dst, MANIFEST_NAME), MANIFEST_BYTES, dst / MANIFEST_NAME, "manifest")
    except (OSError, PixfeedError):
        return None


def check_local(dst: Path, sources: Iterable[Path]) -> None:
    """Raise OverwriteRefusedError unless the existing folder ``dst`` may be replaced: empty, or a whole
    pixfeed dataset (``not_a_dataset``) that holds none of ``sources`` (SRC, an index file)."""
    entries = local_files(dst)
    if not entries:
        return
    text = _manifest_text(dst)
    folders = {rel for rel, is_dir in entries.items() if is_dir}
    why = not_a_dataset(text, [rel for rel in entries if rel not in folders])
    if why is None:
        expected = set(parse_manifest(text, MANIFEST_NAME)["files"])
        stray = sorted(f for f in folders if not any(e.startswith(f"{f}/") for e in expected))
        why = stray and f"not only a pixfeed dataset (it also holds the folder {stray[0]})"
    if why:
        raise OverwriteRefusedError(f"destination {dst} is {why}; {RULE}")
    real = dst.resolve()
    for src in sources:  # DST itself as SRC is refused by the scan, naming it (a repack into itself)
        if src is not None and Path(src).resolve() != real and Path(src).resolve().is_relative_to(real):
            raise OverwriteRefusedError(f"destination {dst} holds the source {src}: replacing it would delete "
                                        "what is being packed, so nothing was touched; choose another DST")


# ---- what a local pack made, and publishing it (docs/untrusted-data.md) --------------------------------
#
# A pack writes into ``.DST.pixfeed-tmp-PID``; a name anyone could give a folder is no proof that pixfeed made
# it.  So each folder a pack makes (and the replaced dataset it moves aside) is recorded, by its device and
# inode, in the user's own cache (``CACHE/packs/``, mode 0700): the next pack removes a dead pack's leftover
# only when its record names that very folder, and puts back a replaced dataset that is the only copy.

def leftover(dst: Path, kind: str, pid: Optional[int] = None) -> Path:
    """The temporary sibling of ``dst`` a pack uses: ``.DST.pixfeed-tmp-PID`` (its output) or
    ``.DST.pixfeed-old-PID`` (a replaced dataset moved aside where the file system cannot exchange)."""
    return dst.parent / f".{dst.name}.pixfeed-{kind}-{os.getpid() if pid is None else pid}"


def _journal(key: str) -> Optional[Path]:
    """The file of the journal entry ``key`` in the user's cache (None, with a warning, when the cache
    cannot hold it: the pack goes on, but what a kill leaves is then the user's to remove)."""
    try:
        make_private_dir(default_dir())  # the cache's own rules: a real folder of this user's, nobody else's to write
        base = default_dir() / "packs"
        make_private_dir(base, default_dir())
    except (OSError, UnsafeCacheError) as e:
        _warn_once(e)
        return None
    return base / f"{key}.json"


_WARNED: list = []


def _warn_once(e: Exception) -> None:
    if not _WARNED:
        _WARNED.append(e)
        log.warning("pixfeed: cannot keep the record of what this pack makes in the cache (%s); if the pack "
                    "is killed, remove what it left yourself", e)


def read_journal(key: str) -> Optional[dict]:
    """The journal entry ``key`` (a dict), or None: none, unreadable, or not a regular file of ours."""
    path = _journal(key)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK) if path else -1
    except OSError:
        return None
    if fd < 0:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.read(fd, 1 << 24))
        return data if isinstance(data, dict) else None
    except (ValueError, OSError, RecursionError):
        return None
    finally:
        os.close(fd)


def write_journal(key: str, entry: dict) -> None:
    path = _journal(key)
    if path is not None:
        try:
            write_json_atomic(path, entry)
        except OSError as e:
            _warn_once(e)


def drop_journal(key: str) -> None:
    path = _journal(key)
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _key(path: Path) -> str:
    return xxhash.xxh3_64_hexdigest(os.fsencode(os.path.abspath(path)))


def _made(path: Path) -> list:
    """The (device, inode) pairs recorded as made by pixfeed at ``path``."""
    entry = read_journal(_key(path)) or {}
    if entry.get("path") != os.path.abspath(path) or not isinstance(entry.get("made"), list):
        return []
    return [tuple(m) for m in entry["made"] if isinstance(m, list) and len(m) == 2]


def claim(path: Path, also: Optional[os.stat_result] = None) -> None:
    """Record that pixfeed made ``path`` as it is now (or, with ``also``, that what ``also`` describes will
    be at ``path``: the dataset a pack replaces)."""
    st = also or os.lstat(path)
    made = sorted(set(_made(path)) | {(st.st_dev, st.st_ino)})
    write_journal(_key(path), {"path": os.path.abspath(path), "made": [list(m) for m in made]})


def disown(path: Path) -> None:
    """Forget the record of ``path`` (it is gone, or published)."""
    drop_journal(_key(path))


def _ours(path: Path) -> Optional[os.stat_result]:
    """``path``'s lstat if the journal records pixfeed as having made it (same device and inode, this
    user's), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if st.st_uid == os.geteuid() and (st.st_dev, st.st_ino) in _made(path) else None


def _remove(path: Path, st: os.stat_result) -> None:
    """Remove ``path`` (a folder pixfeed made, or a link), then its record."""
    if stat.S_ISDIR(st.st_mode):
        remove_tree(path)  # any depth (shutil.rmtree recurses), never through a link
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    disown(path)


_MADE_HERE: Dict[str, tuple] = {}  # temporary folders this process made: path -> (device, inode)


def make_temporary(tmp: Path) -> None:
    """Create the pack's temporary folder ``tmp`` and record it as pixfeed's (in this process, and in the
    journal for the next pack should this one be killed); signals wait until both are done."""
    with interrupt.held():
        os.mkdir(tmp)
        st = os.lstat(tmp)
        _MADE_HERE[os.path.abspath(tmp)] = (st.st_dev, st.st_ino)
        claim(tmp)


def discard(tmp: Path) -> None:
    """Remove this pack's own temporary output ``tmp`` (after a failure), and nothing else."""
    made = _MADE_HERE.pop(os.path.abspath(tmp), None)
    st = _ours(tmp)
    if st is None and made is not None:
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(tmp)
            st = st if (st.st_dev, st.st_ino) == made else None
    if st is not None:
        _remove(tmp, st)


def remove_leftovers(dst: Path) -> None:
    """Clear what dead packs into ``dst`` left: only folders under pixfeed's exact temporary names for
    ``dst`` (compared as text, never as a pattern) that the journal records pixfeed as having made.  A
    replaced dataset moved aside (``-old``) is put back at ``dst`` when ``dst`` is missing (the kill came
    between the two renames): it is the only copy.  Anything else is left alone, with a warning."""
    prefix = f".{dst.name}.pixfeed-"
    try:
        names = [e.name for e in os.scandir(dst.parent) if e.name.startswith(prefix)]
    except (FileNotFoundError, NotADirectoryError):
        return
    found = []
    for name in names:
        kind, _, pid = name[len(prefix):].partition("-")
        if kind in ("tmp", "old") and pid.isdigit() and pid.isascii() and not alive(int(pid)):
            found.append((kind != "old", name))  # -old first: it may have to be put back
    for _, name in sorted(found):
        path = dst.parent / name
        st = _ours(path)
        if st is None:
            log.warning("pixfeed: %s looks like a killed pack's leftover, but pixfeed has no record of making "
                        "it, so it is left alone; remove it yourself if it is yours", path)
        elif name.startswith(f"{prefix}old-") and not os.path.lexists(dst):
            os.rename(path, dst)  # the replaced dataset, the only copy: back in place
            disown(path)
            log.warning("pixfeed: %s was put back from %s, where a killed pack had moved it", dst, path)
        else:
            _remove(path, st)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_AT_FDCWD, _NOREPLACE, _EXCHANGE = -100, 1, 2
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "arm64": 276, "ppc64le": 357, "s390x": 347}


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True when done; False where the kernel, the C library or the file
    system does not have it (then the caller falls back); other errors as OSError."""
    if not sys.platform.startswith("linux"):  # macOS has renamex_np instead; the fallback serves there
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    args = (_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), ctypes.c_uint(flags))
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        result = fn(*args)
    elif platform.machine() in _SYS_RENAMEAT2:
        result = libc.syscall(ctypes.c_long(_SYS_RENAMEAT2[platform.machine()]), *args)
    else:
        return False
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


def _appeared(dst: Path) -> DestinationChangedError:
    return DestinationChangedError(
        f"destination {dst} appeared while the pack ran (it was not there when the pack started); it is left "
        "as it is and the finished pack was removed: choose another DST, or pass --overwrite if it is a "
        "pixfeed dataset to replace")


def publish(tmp: Path, dst: Path, overwrite: bool, sources: Iterable[Path] = ()) -> None:
    """Put the finished ``tmp`` at ``dst``, checking ``dst`` again now: a ``dst`` that appeared while the
    pack ran is refused without ``overwrite`` (DestinationChangedError), and with it must still be what
    --overwrite replaces (``check_replaceable``).  The new dataset takes the old one's place in one step
    (``renameat2(RENAME_EXCHANGE)``) where the file system can; elsewhere the old one is moved aside
    first, and a kill between the two renames leaves it for the next pack to put back."""
    if not os.path.lexists(dst):
        try:
            done = _renameat2(tmp, dst, _NOREPLACE)
        except FileExistsError:
            raise _appeared(dst) from None
        if not done:
            if os.path.lexists(dst):
                raise _appeared(dst)
            os.rename(tmp, dst)
        disown(tmp)
        return
    if not overwrite:
        raise _appeared(dst)
    check_replaceable(dst, sources)
    old_st = os.lstat(dst)
    claim(tmp, also=old_st)  # after the exchange, the old dataset is at tmp's name
    if _renameat2(tmp, dst, _EXCHANGE):
        _remove(tmp, old_st)  # the old dataset, now under tmp's name (recorded just before)
        return
    old = leftover(dst, "old")
    claim(old, also=old_st)
    os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except BaseException:
        os.rename(old, dst)
        disown(old)
        raise
    disown(tmp)
    _remove(old, old_st)


def check_replaceable(dst: Path, sources: Iterable[Path] = ()) -> None:
    """What ``--overwrite`` may replace at an existing ``dst``: a whole pixfeed dataset that holds none of
    ``sources``, an empty folder, or a symbolic link (the link, not its target); OverwriteRefusedError for a
    file or a folder holding anything else."""
    if dst.is_symlink():
        return
    if not dst.is_dir():
        raise OverwriteRefusedError(f"destination {dst} is a file; {RULE}")
    check_local(dst, sources)
