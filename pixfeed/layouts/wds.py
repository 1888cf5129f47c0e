"""Layout of the WebDataset format (``--format wds``): its on-disk constants, imported by both
its writer (pixfeed.packers.wds) and its reader (pixfeed.datasets.wds), so the two cannot disagree.

The layout is documented once, in docs/formats.md#wds.  Reading it with plain
webdataset or tar: the code blocks there, which run in the test suite against a fresh pack.
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
