"""Layout of the WebDataset format (``--format wds``): POSIX tar shards of samples.

::

    shard-000000.tar, shard-000001.tar, ...
    keys.json, pixfeed.json                   pixfeed.json lists every shard under "shards":
                                              [{"name", "count", "bytes", "xxh3_64"}]
    keys.offsets.npy, keys.utf8               the key index (pixfeed/keyindex.py)

Each sample is three consecutive tar members sharing a member key ``K``::

    K.jpg | K.png   encoded mode: the stored image bytes (extension from the real format)
    K.npy           pixels mode: uint8 H x W x 3 RGB, ``np.save(allow_pickle=False)``
    K.cls           the label as ASCII decimal (-1 for a flat source)
    K.json          {"key": pixfeed key, "label", "class": name or null,
                     "size": [H, W] of the source image (after EXIF orientation),
                     "index": record index in the dataset,
                     "xxh3_64": checksum of the image member's bytes, 16 hex digits}

Each field of the manifest's "schema" (pixfeed.fields) is one more member,
``K.NAME.EXT`` (WebDataset's multi-dot naming: ``sample["caption.txt"]``),
so field names never collide with each other or with pixfeed's own members::

    K.NAME.cls      int: ASCII decimal
    K.NAME.txt      str: UTF-8 text; float: its shortest repr, ASCII
    K.NAME.json     json: the JSON text
    K.NAME.bin      bytes: as given
    K.NAME.npy      ndarray and boxes: ``np.save(allow_pickle=False)``; pixels-mode image: H x W x 3
    K.NAME.png      mask: a grayscale PNG (both store modes; lossless)
    K.NAME.jpg|png  encoded-mode image: its bytes

and ``K.json`` gains ``"fields": {NAME: xxh3_64 of the member's bytes, 16 hex digits}``.

Members are deterministic: PAX format, mtime 0, uid/gid 0, no owner names,
mode 0o444.  Member keys: WebDataset splits a member name at the first "." of
its basename and treats "/" as a directory, so the pixfeed key is made flat
and dot-free: NFC-normalised, "/" becomes "__", every character other than a
Unicode letter, digit, "_" or "-" becomes "_" (``cat/my photo.v2`` ->
``cat__my_photo_v2``); a key that is then taken gets "-1", "-2", ...
(first come in source order).  The pixfeed key is kept in ``K.json`` and
``keys.json``.  Record ``i`` of the dataset is the ``i``-th sample in shard
order, so ``keys.json[i]`` is its key.

Reading with plain webdataset or tar::

    for sample in webdataset.WebDataset("DST/shard-{000000..000009}.tar"):
        data, label = sample["jpg"], int(sample["cls"])   # or sample["npy"] in pixels mode
    tar tf DST/shard-000000.tar
"""
from __future__ import annotations

import re
import unicodedata
from typing import List

# the image member's extension by record encoding (pixfeed.packers.records.Record.encoding)
MEMBER_EXTENSIONS = {"jpeg": "jpg", "png": "png", "webp": "webp", "raw": "npy"}
LABEL_EXTENSION, META_EXTENSION = "cls", "json"
FIELD_EXTENSIONS = {"int": "cls", "float": "txt", "str": "txt", "json": "json", "bytes": "bin",
                    "ndarray": "npy", "boxes": "npy", "mask": "png"}  # image: by store and format
_AWKWARD = re.compile(r"[^\w-]")


def shard_name(shard: int) -> str:
    return f"shard-{shard:06d}.tar"


def image_extensions(store: str) -> tuple:
    """The image member extensions a ``store`` mode dataset holds."""
    kinds = ("raw",) if store == "pixels" else ("jpeg", "png", "webp")
    return tuple(MEMBER_EXTENSIONS[k] for k in kinds)


def member_keys(keys: List[str]) -> List[str]:
    """Flat, dot-free, unique tar member keys for pixfeed keys (the rule above)."""
    out, seen = [], set()
    for key in keys:
        base = _AWKWARD.sub("_", unicodedata.normalize("NFC", key).replace("/", "__"))
        name, n = base, 1
        while name in seen:
            name, n = f"{base}-{n}", n + 1
        seen.add(name)
        out.append(name)
    return out
