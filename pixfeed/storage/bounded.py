"""Bounded work on untrusted input (docs/untrusted-data.md, "Bounded work"): the limits on what one file,
tar member, index cell or value read from input may ask for, and the reads that hold to them.

Every length read from input is checked against a limit before anything that size is read or
allocated.  The limits are far above what real datasets need and far below what exhausts a machine;
input past one raises OverLimitError naming the input and the limit, a FIFO, device or socket where a
file is read SpecialFileError (``read_file`` opens without blocking and reads no more than the regular
file's size).
"""
from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, Optional

from ..errors import OverLimitError, SpecialFileError

IMAGE_BYTES = 1 << 30      # one image file or image member (the pixel limit bounds what it decodes to)
MEMBER_BYTES = 256 << 20   # one other tar member or file read into memory: .txt, .json, .npy, .cls, a mask
CELL_CHARS = 64 << 20      # one CSV cell (Python's csv module stops at 128 KiB; long polygon lists pass that)
COLUMNS = 4096             # columns of one index file (each becomes a field)
SPARSE = 64                # a JSONL table may fill at most 64 x the cells its rows hold (+ 1M) with nulls
MANIFEST_BYTES = 256 << 20  # pixfeed.json, keys.json
EXTENSION_BYTES = 1 << 20  # a tar header's extension read whole: a PAX header, a GNU long name
MANIFEST_OBJECTS = 256 << 20  # the Python objects parsing pixfeed.json may build, estimated (json_cost)
CELLS = 4 << 20            # cells (rows x columns) of a Parquet index beyond 16 a byte of the file
CELLS_BYTES = 256 << 20    # text (and nested values) of a Parquet index's cells beyond 64 x the file's bytes
INDEX_BYTES = 16 << 30     # an --index file (CSV, JSONL, Parquet: read whole; Parquet may hold the image bytes)
NAMES_BYTES = 256 << 20    # a --class-names file
INT64 = (-(1 << 63), (1 << 63) - 1)  # labels and sizes are stored as int64


SPARSE_SLACK = 1 << 20    # a file is planned at no more than the blocks it holds plus this (planned_size)


def planned_size(st: os.stat_result) -> int:
    """The bytes a pack plans (and reserves disk) for a source file: its size, but no more than the blocks
    it holds plus 1 MiB.  A sparse file claims a size its disk does not hold (``truncate -s 1G x.jpg``),
    and reserving by that filled a small file system for nothing (its reading is then refused or skipped
    as no image); a file system that reports no blocks (some FUSE mounts) has files planned at 1 MiB, a
    record beyond that going to the pack's part files."""
    return min(st.st_size, st.st_blocks * 512 + SPARSE_SLACK)


def mib(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def check_size(size: int, limit: int, where: object, what: str = "member") -> int:
    """``size`` if it is within ``limit``, else OverLimitError naming ``where``."""
    if size > limit:
        raise OverLimitError(f"{where}: {what} of {size:,} bytes is over pixfeed's limit of {mib(limit)} for one "
                             f"{what} (docs/untrusted-data.md)")
    return size


def _kind(mode: int) -> str:
    return ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a folder" if stat.S_ISDIR(mode) else "not a regular file")


def read_file(path, limit: int, where: Optional[object] = None, what: str = "file") -> bytes:
    """The bytes of the regular file ``path`` (links followed), at most ``limit`` of them: a FIFO, device
    or socket raises SpecialFileError without blocking, a larger file OverLimitError, before any read;
    no more than the size ``fstat`` gave is read (a file that grows is cut there).  OSError as ``open``."""
    return read_open(open_regular(path, where), limit, where or path, what)


def read_open(fd: int, limit: int, where: object, what: str = "file") -> bytes:
    """The bytes of the open regular file ``fd`` (closed after), as ``read_file`` reads them: at most
    ``limit`` (OverLimitError before any read), no more than the size ``fstat`` gave."""
    try:
        size = check_size(os.fstat(fd).st_size, limit, where, what)
        parts, offset = [], 0
        while offset < size:
            part = os.pread(fd, size - offset, offset)
            if not part:
                break
            parts.append(part)
            offset += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    finally:
        os.close(fd)


def read_object(store, name: str, limit: int, where: object, what: str = "file") -> bytes:
    """The bytes of the object ``name`` of a bucket ``store`` (pixfeed.storage.store.Store), at most
    ``limit`` of them: no more than one byte past the limit is fetched, a larger object an OverLimitError
    naming ``where``, as ``read_file`` refuses a larger local file."""
    data = store.read_range(name, 0, limit + 1)
    check_size(len(data), limit, where, what)
    return data


def open_regular(path, where: Optional[object] = None) -> int:
    """A read-only descriptor of the regular file ``path`` (links followed), opened without blocking: a
    FIFO, device or socket raises SpecialFileError (the descriptor closed).  OSError as ``open``; a name
    holding a NUL character FileNotFoundError too (``open``'s is a bare ValueError)."""
    if "\0" in (os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else ""):
        raise FileNotFoundError(errno.ENOENT, "its name holds a NUL character, which no file name can", str(where or path))
    return refuse_special(os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)), where or path)


def refuse_special(fd: int, where: object) -> int:
    """``fd`` if it is a regular file, else SpecialFileError naming ``where`` (the descriptor closed): the
    check is of the file opened, not of a path looked at before."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SpecialFileError(f"{where}: is {_kind(mode)}, not a regular file; only regular files are read")
    return fd


def special_kind(path) -> Optional[str]:
    """"a FIFO", "a device", ... where ``path`` (links followed) exists and is not a regular file or a
    folder, else None (a regular file, a folder, or nothing there)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else _kind(mode)


def json_cost(text) -> int:
    """An upper estimate of the bytes of the Python objects ``json.loads(text)`` builds (CPython, 64-bit),
    from its text alone: each ``{`` 160 (a dict), ``[`` 72 (a list), ``,`` 80 (an item: a string or float
    and its pointer), ``:`` 64 (a key), plus the text.  The text's size alone bounds nothing: a 16 MiB file
    of empty lists is 300 MB of lists."""
    count = text.count if isinstance(text, str) else (lambda c: text.count(c.encode()))
    return 160 * count("{") + 72 * count("[") + 80 * count(",") + 64 * count(":") + len(text)


def loads(text, where: object, objects: Optional[int] = None) -> Any:
    """``json.loads``, nesting too deep for Python's parser (about 1,000 levels) an OverLimitError naming
    ``where``, not a RecursionError; with ``objects``, text whose ``json_cost`` is over it an
    OverLimitError before it is parsed; other errors as json.loads raises them (ValueError)."""
    if objects is not None and json_cost(text) > objects:
        raise OverLimitError(f"{where}: parsing it would build about {json_cost(text) >> 20:,} MiB of objects "
                             f"(it is {len(text):,} bytes, mostly brackets and separators), over pixfeed's limit "
                             f"of {objects >> 20} MiB (docs/untrusted-data.md)")
    try:
        return json.loads(text)
    except RecursionError:
        raise OverLimitError(f"{where}: JSON nested deeper than Python's parser takes (about 1,000 levels)") from None


def int64(value: int, where: object, what: str = "label") -> int:
    """``value`` if it fits the int64 it is stored as, else OverLimitError naming ``where``."""
    if not INT64[0] <= value <= INT64[1]:
        text = str(value) if value.bit_length() < 128 else f"of {value.bit_length()} bits"
        raise OverLimitError(f"{f'{where}: ' if where else ''}{what} {text} does not fit the 64-bit integer it is "
                             "stored as")
    return value


def load_npy(raw: bytes):
    """The array of NumPy ``.npy`` bytes (no pickle), its header checked first: a header declaring more
    data than ``raw`` holds is a ValueError before anything that size is allocated."""
    import io

    import numpy as np

    f = io.BytesIO(raw)
    version = np.lib.format.read_magic(f)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = header(f)
    if dtype.hasobject:
        raise ValueError("the array holds Python objects, which would need pickle")
    count = 1
    for n in shape:
        count *= n
    if count * dtype.itemsize > len(raw) - f.tell():
        raise ValueError(f"its header declares shape {shape} of {dtype} ({count * dtype.itemsize:,} bytes), but "
                         f"{len(raw) - f.tell():,} bytes follow it")
    f.seek(0)
    return np.load(f, allow_pickle=False)
