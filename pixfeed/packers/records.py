"""The record contract: one source image turned into a record.

``load_record`` is the only place a pack reads a source file: it applies the
decode rules of ``pixfeed.image.decode`` (pixels mode) or checks the encoded bytes
(header, end marker, CRCs, bomb limit) and optionally re-encodes them
(``--max-side``), and computes the xxh3_64 checksum every format stores.  The
record carries what writers need to know of the source (its shape, unless
the writer stores none: ``Writer.needs_shape``), so no writer reads a source
file again.
"""
from __future__ import annotations

import errno
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Union

import numpy as np
from PIL import Image

from ..checksum import record_hash
from ..image.decode import (EXTENSIONS, check_encoded, decode, decode_for_pack, library_warnings, pixel_limit, probed,
                            sniff)
from ..errors import Location, SourceError
from ..image.geometry import Plan
from ..image.jpeghead import refusal
from ..sources.folder import Source
from ..storage.bounded import IMAGE_BYTES, read_file
from .fieldrecords import pack_fields
from .options import PackOptions


class Verified(NamedTuple):
    """Encoded bytes a source has already checked against their xxh3_64 ``checksum`` (a pixfeed
    dataset's record, maybe a view of its file): stored as they are, they keep it, unhashed."""
    data: object
    checksum: int


@dataclass
class Record:
    """One sample on its way to a writer."""
    index: int                      # index in the source order
    key: str
    label: int
    data: Union[bytes, np.ndarray]  # encoded bytes, or HxWx3 uint8 pixels
    encoding: str                   # "raw" (pixels), "jpeg", "png" or "webp"
    shape: Optional[tuple]          # (H, W) of the stored image (None: taken unparsed, load_record)
    checksum: int                   # xxh3_64 of the stored bytes
    source_shape: Optional[tuple]   # (H, W) of the source image, after EXIF orientation (None: as shape)
    fields: Dict[str, bytes] = field(default_factory=dict)  # stored bytes of each schema field (fieldrecords)
    field_checksums: List[int] = field(default_factory=list)  # xxh3_64 of each of those


DECODER_NOTE = "decoder warning: "


def load_record(source: Source, i: int, opts: PackOptions, notes: List[str], data=None,
                shape: bool = True) -> Record:
    """``_load_record``, with what the image libraries warn of on the way (Pillow's "palette images
    with transparency", "corrupt EXIF data") kept as notes (``condense_notes``), not printed."""
    caught: List[str] = []
    with library_warnings(caught):
        rec = _load_record(source, i, opts, notes, data, shape)
    notes += [f"{Location(source.where, i)}: {DECODER_NOTE}{text}" for text in dict.fromkeys(caught)]  # once a file
    return rec


def condense_notes(notes: List[str], named: int = 3) -> List[str]:
    """The notes, those of decoder warnings counted per kind (their numbers aside), the first
    ``named`` files of each named."""
    out, kinds = [], {}
    for note in notes:
        where, sep, text = note.partition(f": {DECODER_NOTE}")
        if not sep:
            out.append(note)
            continue
        kinds.setdefault(re.sub(r"\d+", "N", text), (text, []))[1].append(where)
    for text, wheres in kinds.values():
        more = f" and {len(wheres) - named:,} more" if len(wheres) > named else ""
        out.append(f"{DECODER_NOTE}{text} ({len(wheres):,} file{'s' * (len(wheres) > 1)}: "
                   f"{', '.join(wheres[:named])}{more})")
    return out


def _load_record(source: Source, i: int, opts: PackOptions, notes: List[str], data=None,
                 shape: bool = True) -> Record:
    """Turn source image ``i`` into a record (raises SourceError).  ``data``: its bytes when
    already fetched (Source.fetch), or the error that fetching them raised; None reads the file.
    ``shape``: whether the writer stores the image's shape (``Writer.needs_shape``); without it,
    and without fields or ``max_side`` that need it, a record a pixfeed source checked under a
    pixel limit no looser than this pack's, its checksum verified on the way in, is taken unparsed
    (its ``shape`` and ``source_shape`` None)."""
    where = Location(source.where, i)  # formatted only into an error or a note
    known = None  # the stored bytes' checksum, when the source checked it
    if isinstance(data, Verified):
        data, known = data
    if isinstance(data, Exception):
        raise SourceError(f"cannot read ({data})") from None
    if data is None:
        path = source.root / source.paths[i]
        try:
            data = read_file(path, IMAGE_BYTES, where, "image file")  # a FIFO or device: an error, not a hang
        except OSError as e:
            raise SourceError(f"{where}: cannot read ({_read_error(path, e)})") from None
    fmt = sniff(data)
    if not source.checked:  # a pixfeed source's records were named when first packed
        _check_name(source.paths[i], fmt, where, notes)
    if opts.store == "pixels":  # one acceptance rule for both stores (check_encoded), then the pixels
        data = bytes(data)
        check_encoded(data, where, opts.max_pixels)
        arr, source_shape, plan = decode_for_pack(data, opts.size, opts.resize, where, opts.max_pixels)
        arr = np.ascontiguousarray(arr)
        rec = Record(i, source.keys[i], int(source.labels[i]), arr, "raw", arr.shape[:2], record_hash(arr),
                     source_shape)
    else:
        unparsed = known is not None and fmt is not None and not (shape or source.schema or opts.max_side) \
            and _checked_within(source, opts) and not (fmt == "JPEG" and refusal(data))  # older packs took those
        head = (fmt, None) if unparsed else _checked_before(source, data, fmt, where, opts)
        if head is None:  # parsed in full, as bytes (not a view of a source's file)
            data = bytes(data)
            head = check_encoded(data, where, opts.max_pixels, full=opts.full_check)
        fmt, source_shape = head
        stored, plan = source_shape, None
        if opts.max_side and max(stored) > opts.max_side:
            (data, stored), known = _reencode(data, where, opts), None
            fmt = "JPEG"
            plan = Plan(None, source_shape[::-1], stored[::-1], (0, 0))  # a stretch to the re-encoded size
        rec = Record(i, source.keys[i], int(source.labels[i]), data, fmt.lower(), stored and tuple(stored),
                     record_hash(data) if known is None else int(known), source_shape and tuple(source_shape))
    if source.schema:
        rec.fields = pack_fields(source, i, opts, plan, rec.shape, source_shape)
        rec.field_checksums = [record_hash(b) for b in rec.fields.values()]
    return rec


def _check_name(path: str, fmt, where, notes: List[str]) -> None:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if fmt and ext in ("jpg", "jpeg", "png", "webp") and EXTENSIONS[fmt] != ext.replace("jpeg", "jpg"):
        notes.append(f"{where}: is a {fmt} file despite its .{ext} name; stored as {fmt}")


def _checked_within(source: Source, opts: PackOptions) -> bool:
    """Whether ``source``'s records were checked (when first packed) under a decompression-bomb limit
    no looser than this pack's, so that none exceeds it (a source's ``checked_limit``: its manifest's
    ``max_pixels`` option; -1 when it records none), and this pack asks for no fuller check."""
    limit = pixel_limit(opts.max_pixels)
    return source.checked and not opts.full_check and source.checked_limit != -1 and \
        (limit is None or (source.checked_limit is not None and source.checked_limit <= limit))


def _checked_before(source: Source, data: bytes, fmt, where, opts: PackOptions):
    """(format, (H, W) after orientation) of a JPEG record from a pixfeed dataset (checked when it
    was first packed, its checksum verified on the way in) from its header alone, as the view it is
    (its end marker was checked then too).  None: check it as any file."""
    if opts.full_check or not source.checked or fmt != "JPEG":
        return None
    hw = probed(data, where, opts.max_pixels)
    return None if hw is None else ("JPEG", hw)


def _read_error(path: Path, e: OSError) -> str:
    """Why ``path`` cannot be read, naming broken symbolic links and loops."""
    if e.errno == errno.ELOOP:
        return f"symbolic link loop: {e.strerror}"
    if e.errno == errno.ENOENT and path.is_symlink():
        return f"broken symbolic link to {os.readlink(path)!r}"
    return e.strerror or str(e)


def _reencode(data: bytes, where: str, opts: PackOptions):
    arr = decode(data, where=where, max_pixels=opts.max_pixels, exact=True)
    h, w = arr.shape[:2]
    scale = opts.max_side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    buf = io.BytesIO()
    Image.fromarray(arr).resize(size, Image.BILINEAR).save(buf, "JPEG", quality=opts.quality)
    return buf.getvalue(), (size[1], size[0])
