"""Where input may point: one rule per boundary, checked where a path enters (docs/untrusted-data.md).

* ``inside(name)``: a path a manifest or an index names relative to its folder stays in that folder:
  relative, no ``..`` part, no NUL (checked on the text, before anything is opened).
* ``outside_src(path)``: why an index's image or mask path leaves SRC (absolute, or climbing out
  with ``..``), else None; ``allow_outside_src`` accepts such paths (Hugging Face's ``to_parquet``
  writes absolute ones).
* ``check_dataset_links(root)``: a local dataset holds no symbolic link (one could point a read at
  any file of the machine); ``allow_links`` accepts them.
* ``open_inside(root, rel)``: a dataset file opened part by part with ``O_NOFOLLOW``, so the file
  read is the file checked (a link swapped in after a check is refused, not followed); ``map_inside``
  memory-maps a file so opened, ``opened_path`` names an opened file for a library that opens by path.
* ``check_cache_dir(folder)`` / ``make_private_dir(folder)`` / ``open_nofollow(path, flags)`` /
  ``check_no_links(root, rel)``: the node-local cache of bucket datasets is this user's alone (owned
  by them, writable by nobody else), created 0700, and no file of it is opened through a link.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Optional

from ..errors import OutsideDatasetError, UnsafeCacheError

LINKS_OPTION = "allow_links=True (pixfeed verify/pack --allow-links)"


def inside(name) -> bool:
    """Whether ``name`` is a relative path that stays inside its folder: not empty, not absolute, no
    ``..`` part (with "/" or the OS separator), no NUL."""
    if not isinstance(name, str) or not name or "\0" in name:
        return False
    parts = name.replace(os.sep, "/").split("/")
    return not name.startswith(("/", os.sep)) and not os.path.isabs(name) and ".." not in parts


def outside_src(path: str) -> Optional[str]:
    """Why an index's relative ``path`` would leave SRC: "is an absolute path", "climbs out of SRC with
    '..'"; None when it stays inside (``a/../b.jpg`` does)."""
    if path.startswith(("/", "\\")) or os.path.isabs(path) or PurePosixPath(path.replace("\\", "/")).is_absolute():
        return "is an absolute path"
    depth = 0
    for part in path.replace("\\", "/").split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return "climbs out of SRC with '..'"
        elif part not in ("", "."):
            depth += 1
    return None


def check_dataset_links(root: Path, allow_links: bool = False) -> None:
    """Raise OutsideDatasetError at the first symbolic link inside the local dataset ``root`` (the
    folder itself may be a link: it is the user's own path), unless ``allow_links``."""
    if allow_links:
        return
    todo = [Path(root)]
    while todo:
        folder = todo.pop()
        with os.scandir(folder) as entries:
            for e in entries:
                if e.is_symlink():
                    raise OutsideDatasetError(
                        f"{Path(e.path)}: a symbolic link inside the dataset {root} (to {target(e.path)}); "
                        f"a dataset's files must be its own, so links are refused: replace the link by the file, "
                        f"or pass {LINKS_OPTION} if you trust where it points")
                if e.is_dir(follow_symlinks=False):
                    todo.append(Path(e.path))


def check_cache_dir(folder: Path) -> None:
    """Raise UnsafeCacheError unless ``folder`` is a real folder (not a link), owned by this user and
    writable by nobody else: anyone who can write there could plant the data a reader trusts."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder"
        raise UnsafeCacheError(f"cache folder {folder}: is {what}; the cache must be a folder of your own "
                               "(set PIXFEED_CACHE or cache_dir= to one)")
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = (f"owned by uid {st.st_uid}, not you (uid {os.geteuid()})" if st.st_uid != os.geteuid() else
               f"writable by others (mode {stat.S_IMODE(st.st_mode):o})")
        raise UnsafeCacheError(f"cache folder {folder}: is {why}; anyone who can write there could plant the "
                               "data pixfeed reads, so the cache must be yours alone: chmod go-w it, or set "
                               "PIXFEED_CACHE or cache_dir= to a folder of your own")


def make_private_dir(folder: Path, base: Optional[Path] = None) -> None:
    """Create ``folder`` (and missing parents) mode 0700, or check the existing one (``check_cache_dir``);
    with ``base``, every folder from ``base`` down to ``folder`` is checked to be a real folder."""
    folder = Path(folder)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
    check_cache_dir(folder)
    if base is not None:
        check_no_links(Path(base), folder.relative_to(base).as_posix())


def link_in(root: Path, rel: str) -> Optional[Path]:
    """The first part of ``root/rel`` below ``root`` that is a symbolic link, else None."""
    path = Path(root)
    for part in PurePosixPath(rel).parts:
        path = path / part
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                return path
        except (FileNotFoundError, NotADirectoryError):
            return None
    return None


def open_inside(root: Path, rel: str, allow_links: bool = False) -> int:
    """A read-only descriptor of the regular file ``root/rel`` of a dataset, the file that is read being the
    one that was checked: each part below ``root`` is opened with ``O_NOFOLLOW`` from the folder opened
    before it, so a symbolic link anywhere below ``root``, there all along or swapped in a moment ago, is
    OutsideDatasetError (unless ``allow_links``: then links are followed); a FIFO, device or socket is
    SpecialFileError, found on the descriptor, never blocking.  ``root`` itself may be a link (the user's
    own path).  OSError as ``open`` for a missing file."""
    from .bounded import open_regular, refuse_special

    path = Path(root) / rel
    if allow_links:
        return open_regular(path)
    parts = PurePosixPath(rel).parts
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | os.O_NOFOLLOW
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in parts[:-1]:
            inner = os.open(part, flags | os.O_DIRECTORY, dir_fd=folder)
            os.close(folder)
            folder = inner
        fd = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=folder)
    except OSError as e:
        if e.errno != errno.ELOOP and not (e.errno == errno.ENOTDIR and link_in(root, rel)):
            raise
        link = link_in(root, rel) or path
        raise OutsideDatasetError(f"{link}: a symbolic link inside the dataset (to {target(link)}), not read; a "
                                  f"dataset's files must be its own: pass {LINKS_OPTION} if you trust where it "
                                  "points") from None
    finally:
        os.close(folder)
    return refuse_special(fd, path)


def opened_path(fd: int, path) -> str:
    """A path naming the very file open as ``fd`` (``/proc/self/fd/N`` on Linux; ``path`` elsewhere), for a
    library that opens by path (numpy's memmap): it opens the file that was checked, not whatever ``path``
    names by then."""
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.exists(proc) else str(path)


def map_inside(root: Path, rel: str, allow_links: bool = False, npy: bool = True):
    """The dataset file ``root/rel`` memory-mapped read-only from the file ``open_inside`` opened and checked
    (no link followed unless ``allow_links``): a .npy array as ``numpy.load(mmap_mode="r")`` gives it
    (ValueError or EOFError where it is not one), else its bytes as a uint8 memmap (an empty file: an
    empty array, which mmap cannot give).  The descriptor is closed once mapped."""
    import numpy as np

    fd = open_inside(root, rel, allow_links)
    try:
        if npy:
            return np.load(opened_path(fd, Path(root) / rel), mmap_mode="r", allow_pickle=False)
        if not os.fstat(fd).st_size:
            return np.zeros(0, np.uint8)
        return np.memmap(opened_path(fd, Path(root) / rel), np.uint8, "r")
    finally:
        os.close(fd)


def target(link) -> str:
    """Where the symbolic link ``link`` points, quoted, for a message; it may have changed since it was
    looked at (then a word saying so, not an OSError)."""
    try:
        return repr(os.readlink(link))
    except OSError:
        return "somewhere: it changed while it was checked"


def check_no_links(root: Path, rel: str) -> None:
    """Raise UnsafeCacheError if any part of ``root/rel`` below ``root`` is a symbolic link."""
    path = link_in(root, rel)
    if path is not None:
        raise UnsafeCacheError(f"{path}: a symbolic link in the cache (to {target(path)}); pixfeed writes "
                               "and reads its cache only through its own files, so it refuses links: remove it")


def open_nofollow(path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symbolic link as the last part (UnsafeCacheError naming it)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):  # O_NOFOLLOW met a link
            raise UnsafeCacheError(f"{path}: a symbolic link in the cache (to {target(path)}); pixfeed "
                                   "refuses links in its cache: remove it") from None
        raise


def remove_tree(path) -> None:
    """Remove the folder ``path`` and all under it, at any depth and without following a link: a loop over
    descriptors (``shutil.rmtree`` recurses a Python level a folder before 3.12, so a tree 1,200 deep planted
    in a folder pixfeed removes raised RecursionError), entries removed relative to their folder's
    descriptor. What cannot be removed is left, as ``rmtree(ignore_errors=True)`` leaves it."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        stack = [(os.open(path, flags), None, None, set())]
    except OSError:  # gone, not a folder, or a link: a link is removed, never followed
        with contextlib.suppress(OSError):
            if os.path.islink(path):
                os.unlink(path)
        return
    while stack:
        fd, parent, name, stuck = stack[-1]
        sub = None
        with contextlib.suppress(OSError), os.scandir(fd) as entries:
            for entry in entries:
                if entry.name in stuck:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    sub = entry.name
                    break
                with contextlib.suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
        if sub is not None:
            try:
                stack.append((os.open(sub, flags, dir_fd=fd), fd, sub, set()))
            except OSError:
                stuck.add(sub)
            continue
        stack.pop()
        os.close(fd)
        try:
            os.rmdir(path) if parent is None else os.rmdir(name, dir_fd=parent)
        except OSError:  # not empty (an entry that would not go), no permission: left, the rest goes on
            if parent is not None:
                stack[-1][3].add(name)
