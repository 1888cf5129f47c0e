"""Tar member streams written straight to a file, and joined into one archive.

A member is its header (``TarInfo.tobuf``: the bytes ``TarFile.addfile``
writes), its data, and zeros up to a 512-byte block.  An archive is its
members, two zero blocks, and zeros up to a 10240-byte record (what
``TarFile.close`` writes).  So member streams written by separate processes,
concatenated and then ended, are byte for byte the archive one ``TarFile``
would write, without TarFile's copies of every member's data.
"""
from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import BinaryIO, List

from ._files import copy_range

BLOCK, RECORD = tarfile.BLOCKSIZE, tarfile.RECORDSIZE
_ENCODING, _ERRORS = "utf-8", "surrogateescape"  # TarFile's defaults on a UTF-8 system


def member_info(name: str, size: int) -> tarfile.TarInfo:
    """A deterministic member: mtime 0, uid/gid 0, no owner names, mode 0o444."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o444, 0, 0
    return info


def header(name: str, size: int) -> bytes:
    """``member_info(name, size)``'s header as ``TarFile`` writes it.  A short ASCII name and a size
    under 8 GiB (a plain ustar header) are patched into a template: 3 us instead of tobuf's 18."""
    raw = name.encode("ascii") if name.isascii() else b""
    if not 0 < len(raw) <= 100 or b"\0" in raw or size >= 8 ** 11:
        return member_info(name, size).tobuf(tarfile.PAX_FORMAT, _ENCODING, _ERRORS)
    buf = bytearray(_TEMPLATE)
    buf[:len(raw)] = raw
    buf[124:136] = b"%011o\0" % size
    buf[148:156] = b" " * 8
    buf[148:155] = b"%06o\0" % sum(buf)  # the checksum: every byte, its own field counted as spaces
    return bytes(buf)


_TEMPLATE = member_info("", 0).tobuf(tarfile.PAX_FORMAT, _ENCODING, _ERRORS)


def write_member(f: BinaryIO, name: str, data: bytes) -> int:
    """Write member ``name`` holding ``data`` at ``f``'s position; return the bytes written."""
    head, padding = header(name, len(data)), -len(data) % BLOCK
    f.write(head)
    f.write(data)
    f.write(bytes(padding))
    return len(head) + len(data) + padding


def end_archive(f: BinaryIO, offset: int) -> None:
    """End an archive whose members take ``offset`` bytes (``f`` is positioned after them)."""
    offset += 2 * BLOCK
    f.write(bytes(2 * BLOCK + -offset % RECORD))


def join(parts: List[Path], dst: Path) -> None:
    """Concatenate the member streams ``parts`` into the archive ``dst``; remove the parts."""
    parts[0].replace(dst)
    with open(dst, "r+b") as out:
        end = out.seek(0, os.SEEK_END)
        for part in parts[1:]:
            with open(part, "rb") as f:
                end += copy_range(f, 0, out, end, os.fstat(f.fileno()).st_size)
            part.unlink()
        out.seek(end)
        end_archive(out, end)
