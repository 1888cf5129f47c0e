"""The record contract: pack options, and one source image turned into a record.

``load_record`` is the only place a source file is read: it applies the
decode rules of ``pixfeed.decode`` (pixels mode) or checks the encoded bytes
(header, end marker, CRCs, bomb limit) and optionally re-encodes them
(``--max-side``), and computes the xxh3_64 checksum every format stores.
"""
from __future__ import annotations

import errno
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Union

import numpy as np
from PIL import Image

from ..checksum import record_hash
from ..decode import EXTENSIONS, check_encoded, decode, parse_size, sniff
from ..errors import OptionError, SourceError
from ..source import Source

ON_ERROR = ("fail", "skip")


@dataclass
class PackOptions:
    store: Optional[str] = None          # "pixels" | "encoded"; None = the format's default
    size: object = 256                   # pixels mode: S or "HxW"
    resize: str = "crop"                 # crop | pad | stretch
    max_side: Optional[int] = None       # encoded mode: re-encode larger images to JPEG
    quality: int = 90
    ext: Optional[str] = None
    workers: Optional[int] = None
    on_error: str = "fail"
    overwrite: bool = False
    max_pixels: Optional[int] = None     # decompression-bomb limit; None = Pillow's
    full_check: bool = False             # encoded mode: decode every image while packing
    shard_size: Optional[int] = None     # wds
    shard_bytes: Optional[int] = None    # wds
    shuffle: bool = True                 # wds
    seed: int = 0                        # wds
    compression: Optional[str] = None    # hdf5

    def check(self) -> None:
        if self.store not in ("pixels", "encoded"):
            raise OptionError(f"--store {self.store!r}: expected pixels or encoded")
        if self.on_error not in ON_ERROR:
            raise OptionError(f"--on-error {self.on_error!r}: expected fail or skip")
        if self.workers is not None and self.workers < 1:
            raise OptionError(f"--workers {self.workers}: must be at least 1")
        if self.max_side is not None and self.max_side < 1:
            raise OptionError(f"--max-side {self.max_side}: must be a positive number of pixels")
        if not 1 <= self.quality <= 100:
            raise OptionError(f"--quality {self.quality}: must be between 1 and 100")
        self.size = parse_size(self.size) if self.store == "pixels" else None


@dataclass
class Record:
    """One sample on its way to a writer."""
    index: int                      # index in the source order
    key: str
    label: int
    data: Union[bytes, np.ndarray]  # encoded bytes, or HxWx3 uint8 pixels
    encoding: str                   # "raw" (pixels), "jpeg" or "png"
    shape: tuple                    # (H, W) of the decoded image
    checksum: int                   # xxh3_64 of the stored bytes


def load_record(source: Source, i: int, opts: PackOptions, notes: List[str], data=None) -> Record:
    """Turn source image ``i`` into a record (raises SourceError).  ``data``: its bytes when
    already fetched (Source.fetch), or the error that fetching them raised; None reads the file."""
    where = source.where(i)
    if isinstance(data, Exception):
        raise SourceError(f"cannot read ({data})") from None
    if data is None:
        path = source.root / source.paths[i]
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise SourceError(f"{where}: cannot read ({_read_error(path, e)})") from None
    fmt, ext = sniff(data), os.path.splitext(source.paths[i])[1].lower().lstrip(".")
    if fmt and ext in ("jpg", "jpeg", "png") and EXTENSIONS[fmt] != ext.replace("jpeg", "jpg"):
        notes.append(f"{where}: is a {fmt} file despite its .{ext} name; stored as {fmt}")
    if opts.store == "pixels":
        arr = np.ascontiguousarray(decode(data, size=opts.size, resize_mode=opts.resize, where=where,
                                          max_pixels=opts.max_pixels))
        return Record(i, source.keys[i], int(source.labels[i]), arr, "raw", arr.shape[:2], record_hash(arr))
    fmt, shape = check_encoded(data, where, opts.max_pixels, full=opts.full_check)
    if opts.max_side and max(shape) > opts.max_side:
        data, shape = _reencode(data, where, opts)
        fmt = "JPEG"
    return Record(i, source.keys[i], int(source.labels[i]), data, fmt.lower(), tuple(shape), record_hash(data))


def _read_error(path: Path, e: OSError) -> str:
    """Why ``path`` cannot be read, naming broken symbolic links and loops."""
    if e.errno == errno.ELOOP:
        return f"symbolic link loop: {e.strerror}"
    if e.errno == errno.ENOENT and path.is_symlink():
        return f"broken symbolic link to {os.readlink(path)!r}"
    return e.strerror or str(e)


def _reencode(data: bytes, where: str, opts: PackOptions):
    arr = decode(data, where=where, max_pixels=opts.max_pixels)
    h, w = arr.shape[:2]
    scale = opts.max_side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    buf = io.BytesIO()
    Image.fromarray(arr).resize(size, Image.BILINEAR).save(buf, "JPEG", quality=opts.quality)
    return buf.getvalue(), (size[1], size[0])
