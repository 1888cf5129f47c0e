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
    field = b"%011o\0" % size
    # the checksum: every byte, its own field counted as spaces (the template's, less its empty fields)
    checksum = b"%06o\0" % (_TEMPLATE_SUM + sum(raw) + sum(field))
    return b"".join((raw, _TEMPLATE[len(raw):124], field, _TEMPLATE[136:148], checksum, _TEMPLATE[155:]))


_TEMPLATE = member_info("", 0).tobuf(tarfile.PAX_FORMAT, _ENCODING, _ERRORS)
_TEMPLATE_SUM = sum(_TEMPLATE[:148]) + 8 * ord(" ") + sum(_TEMPLATE[156:]) - sum(_TEMPLATE[124:136])
_ZEROS = bytes(RECORD)


def member(name: str, data) -> List:
    """Member ``name`` holding ``data``: its header, data and padding, to be written in that order."""
    return [header(name, len(data)), data, _ZEROS[:-len(data) % BLOCK]]


def end(offset: int) -> bytes:
    """What ends an archive whose members take ``offset`` bytes."""
    return bytes(2 * BLOCK + -(offset + 2 * BLOCK) % RECORD)


def end_archive(f: BinaryIO, offset: int) -> None:
    """End an archive whose members take ``offset`` bytes (``f`` is positioned after them)."""
    f.write(end(offset))


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
