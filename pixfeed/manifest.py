"""The manifest ``pixfeed.json``: the contract between packers and readers.

It is written last, to a temporary name, and renamed into place, so a
directory with a manifest is a finished dataset.  Fields::

    magic            "pixfeed-dataset"
    layout_version   integer; readers refuse versions they do not know (2; 1 = before fields, still read)
    format           a name in pixfeed.registry.FORMATS ("mmap" | "lmdb" | "hdf5" | "wds")
    count            number of records
    classes          sorted class names, or null for a flat source
    store            "pixels" (decoded uint8 RGB, HxWx3) | "encoded" (image file bytes)
    shape            [H, W, 3] in pixels mode, else null
    checksum         "xxh3_64"
    keys_file        "keys.json": JSON list of record keys in record order
    key_index        {"offsets": "keys.offsets.npy", "blob": "keys.utf8"}: one key at a time (pixfeed.keyindex);
                     absent in packs made before it
    files            {relative path: {"bytes": int, "xxh3_64": hex}} for every data file
    shards           (wds only) [{"name", "count", "bytes", "xxh3_64"}]
    chunks           (mmap, hdf5) {"bytes": 16 MiB, "xxh3_64": {data file: [hex per chunk]}}, checked by the
                     chunk cache (pixfeed.storage.chunked); packs without it get the list computed on first use
    skipped          [{"path", "reason"}] files left out under --on-error skip
    schema           [{"name", "type", "dtype"?, "shape"?}] the typed fields beside image and label
                     (pixfeed.fields; absent or [] when there are none)
    per_box          names of fields with one row per box (dropped with their boxes), or []
    source           where the samples came from: {"kind": "folder"} or {"kind": "index", "index", ...}
    options          the pack options used
    pixfeed_version, created
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import DatasetError, DatasetNotFoundError, OutsideDatasetError
from .registry import FORMATS
from .storage.store import BucketNotFoundError, Store, is_url, local_path

MANIFEST_NAME = "pixfeed.json"
KEYS_NAME = "keys.json"
MAGIC = "pixfeed-dataset"
LAYOUT_VERSION = 2
READABLE_VERSIONS = (1, 2)
STORES = ("pixels", "encoded")


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temporary sibling and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)  # never through a planted link
    with open(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_manifest(root: Path, manifest: dict) -> None:
    validate(manifest, root / MANIFEST_NAME)
    write_json_atomic(root / MANIFEST_NAME, manifest)


def read_manifest(root: str | os.PathLike, storage_options: dict | None = None, allow_links: bool = False) -> dict:
    """Read and validate ``root/pixfeed.json`` (``root`` may be a URL); raise a clear DatasetError otherwise
    (OutsideDatasetError for a manifest that is a symbolic link, unless ``allow_links``)."""
    if is_url(root):
        return _read_remote(root, storage_options)
    root = local_path(root)
    path = root / MANIFEST_NAME
    if not root.exists():
        raise DatasetNotFoundError(f"{root}: no such dataset directory")
    if not root.is_dir():
        raise DatasetError(f"{root}: not a directory; a pixfeed dataset is a directory holding {MANIFEST_NAME}")
    if not path.is_file():
        raise DatasetError(f"{root}: not a pixfeed dataset (no {MANIFEST_NAME}); pack one with 'pixfeed pack'")
    from .storage.bounded import MANIFEST_BYTES, read_open
    from .storage.paths import open_inside, target

    if path.is_symlink() and not allow_links:
        raise OutsideDatasetError(f"{path}: the manifest is a symbolic link (to {target(path)}); a "
                                  "dataset's files must be its own: pass allow_links=True (--allow-links) if "
                                  "you trust where it points")
    fd = open_inside(root, MANIFEST_NAME, allow_links)  # the file read is the one checked: no link swapped in
    return parse_manifest(read_open(fd, MANIFEST_BYTES, path, "manifest"), path)


def _read_remote(url: str, storage_options: dict | None) -> dict:
    from .storage.bounded import MANIFEST_BYTES, read_object

    store = Store(url, storage_options)
    try:
        text = read_object(store, MANIFEST_NAME, MANIFEST_BYTES, store.url_of(MANIFEST_NAME), "manifest")
    except DatasetNotFoundError as e:
        if isinstance(e, BucketNotFoundError):
            raise
        raise DatasetNotFoundError(f"{store.url}: not a pixfeed dataset (no {MANIFEST_NAME}); pack one with "
                                   "'pixfeed pack SRC URL'") from None
    return parse_manifest(text, store.url_of(MANIFEST_NAME))


def parse_manifest(text: str | bytes, where: object = MANIFEST_NAME) -> dict:
    """Parse and validate manifest text: the one parser, used by read_manifest and
    fuzzed by the property tests."""
    from .storage.bounded import MANIFEST_OBJECTS, loads

    try:  # what the parse may build bounded by an estimate from the text, before it runs
        manifest = loads(text, where, MANIFEST_OBJECTS)
    except ValueError as e:  # not JSON, not UTF-8, or a number of more than 4,300 digits (Python's limit)
        raise DatasetError(f"{where}: manifest is not valid JSON ({e})") from None
    validate(manifest, where)
    return manifest


def _require(cond: bool, where: object, msg: str) -> None:
    if not cond:
        raise DatasetError(f"{where}: {msg}")


def validate(m: Any, where: object) -> None:
    """Check the fields every reader relies on, with the offending field named."""
    _require(isinstance(m, dict) and m.get("magic") == MAGIC, where, f"not a pixfeed manifest (no \"magic\": \"{MAGIC}\")")
    v = m.get("layout_version")
    _require(isinstance(v, int) and not isinstance(v, bool), where, f"layout_version {v!r} is not an integer")
    _require(v in READABLE_VERSIONS, where,
             f"layout_version {v} is not supported by this pixfeed (it reads versions 1 and {LAYOUT_VERSION}); "
             "upgrade pixfeed or re-pack the dataset")
    _require(isinstance(m.get("format"), str) and m["format"] in FORMATS, where,
             f"unknown format {m.get('format')!r}; expected one of {', '.join(FORMATS)}")
    _require(m.get("store") in STORES, where, f"unknown store {m.get('store')!r}; expected one of {', '.join(STORES)}")
    n = m.get("count")
    _require(isinstance(n, int) and not isinstance(n, bool) and n >= 0, where, f"count {n!r} is not a non-negative integer")
    classes = m.get("classes")
    _require(classes is None or (isinstance(classes, list) and all(isinstance(c, str) for c in classes)),
             where, "classes must be null or a list of strings")
    shape = m.get("shape")
    if m["store"] == "pixels":
        _require(isinstance(shape, list) and len(shape) == 3 and shape[2] == 3
                 and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape),
                 where, f"shape {shape!r} must be [H, W, 3] with positive integers in pixels mode")
    from .fields import from_json
    from_json(m.get("schema"), where)
    files = m.get("files")
    _require(isinstance(files, dict), where, "files must be an object")
    for name, meta in files.items():
        _require(isinstance(name, str) and name and "\0" not in name and not os.path.isabs(name)
                 and ".." not in Path(name).parts,
                 where, f"file name {name!r} must be a relative path inside the dataset")
        size = meta.get("bytes") if isinstance(meta, dict) else None
        _require(isinstance(size, int) and not isinstance(size, bool) and size >= 0
                 and isinstance(meta.get("xxh3_64"), str),
                 where, f"files[{name!r}] must have a non-negative integer 'bytes' and a string 'xxh3_64'")
    _check_named_paths(m, where)
    _check_bounded(m, where)


def _check_named_paths(m: dict, where: object) -> None:
    """Every other path the manifest names (the keys' files, the shards) stays inside the dataset: checked
    on the text, before any is opened (OutsideDatasetError naming the entry)."""
    from .storage.paths import inside

    named = [("keys_file", m["keys_file"])] if "keys_file" in m else []
    entry = m.get("key_index")
    if entry is not None:
        named += [(f"key_index[{k!r}]", entry.get(k) if isinstance(entry, dict) else entry) for k in ("offsets", "blob")]
    shards = m.get("shards")
    if shards is not None:
        named += [(f"shards[{n}].name", s.get("name") if isinstance(s, dict) else s)
                  for n, s in enumerate(shards if isinstance(shards, list) else [shards])]
    for what, name in named:
        if not inside(name):
            raise OutsideDatasetError(f"{where}: {what} {name!r} must be a relative path inside the dataset "
                                      "(no absolute path, no '..'); a dataset reads only its own files")


_TYPES = {"keys_file": (str, "a file name"), "checksum": (str, "a string"), "key_index": (dict, "an object"),
          "shards": (list, "a list"), "per_box": (list, "a list"), "skipped": (list, "a list"),
          "notes": (list, "a list"), "source": (dict, "an object"), "options": (dict, "an object"),
          "chunks": (dict, "an object"), "created": (str, "a string"), "pixfeed_version": (str, "a string")}


def _check_bounded(m: dict, where: object) -> None:
    """The other entries have the types readers rely on, and the numbers are bounded by the data listed
    (docs/untrusted-data.md, "Bounded work"): a count above the bytes of the files (every record takes
    some), or a pixels record over IMAGE_BYTES, is refused before anything is allocated or looped over."""
    from .storage.bounded import IMAGE_BYTES, INT64

    for key in ("classes", "shape"):  # every reader looks them up (null when there are none)
        _require(key in m, where, f"no {key!r} entry (null when there are none)")
    for key, (kind, what) in _TYPES.items():
        value = m.get(key)
        _require(value is None or isinstance(value, kind), where, f"{key} must be {what}, not {type(value).__name__}")
    total = sum(meta["bytes"] for meta in m["files"].values())
    _require(m["count"] <= total, where, f"count {m['count']:,} is more records than the {total:,} bytes of its "
                                         "files can hold")
    if m["store"] == "pixels":
        h, w, c = m["shape"]
        _require(h * w * c <= IMAGE_BYTES, where, f"shape {m['shape']} is over pixfeed's limit of "
                                                  f"{IMAGE_BYTES >> 20} MiB for one record")
    for key in ("per_box", "notes"):
        _require(all(isinstance(v, str) for v in m.get(key) or []), where, f"{key} must be a list of strings")
    for n, skip in enumerate(m.get("skipped") or []):
        _require(isinstance(skip, dict) and all(isinstance(skip.get(k), str) for k in ("path", "reason")), where,
                 f"skipped[{n}] must have a string 'path' and 'reason'")
    _require(m["shape"] is None or m["store"] == "pixels", where, f"shape {m['shape']!r} must be null in encoded mode")
    entry = m.get("key_index")
    _require(entry is None or all(isinstance(entry.get(k), str) for k in ("offsets", "blob")), where,
             "key_index must name its 'offsets' and 'blob' files")
    for n, shard in enumerate(m.get("shards") or []):
        _require(isinstance(shard, dict) and isinstance(shard.get("name"), str)
                 and all(isinstance(shard.get(k), int) and not isinstance(shard.get(k), bool) and shard[k] >= 0
                         for k in ("count", "bytes")) and isinstance(shard.get("xxh3_64"), str),
                 where, f"shards[{n}] must have a 'name', non-negative integer 'count' and 'bytes', and 'xxh3_64'")
    chunks = m.get("chunks")
    if chunks is not None:
        size, sums = chunks.get("bytes"), chunks.get("xxh3_64")
        _require(isinstance(size, int) and not isinstance(size, bool) and size > 0 and isinstance(sums, dict)
                 and all(isinstance(v, list) and all(isinstance(h, str) for h in v) for v in sums.values()),
                 where, "chunks must have a positive integer 'bytes' and 'xxh3_64' lists of strings")
    numbers = [("count", m["count"]), ("the files' bytes", total), ("chunks.bytes", (chunks or {}).get("bytes", 0))]
    numbers += [(f"shards[{n}].{k}", shard[k]) for n, shard in enumerate(m.get("shards") or []) for k in ("count", "bytes")]
    for what, n in numbers:  # readers size arrays and offsets as int64
        _require(n <= INT64[1], where, f"{what} {n if n < 1 << 128 else f'of {n.bit_length()} bits'} does not fit "
                                       "the 64-bit integer readers size arrays by")
