"""Property tests of the manifest parser on random input: ``parse_manifest``
returns exactly the parsed JSON when it follows the documented contract, and
raises a DatasetError naming the manifest otherwise; it never crashes.
(The record-header parser has its own property tests in test_record.py.)"""
from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pixfeed.errors import DatasetError
from pixfeed.manifest import LAYOUT_VERSION, MAGIC, STORES, parse_manifest
from pixfeed.registry import FORMATS

WHERE = "some/ds/pixfeed.json"
VALID = {"magic": MAGIC, "layout_version": LAYOUT_VERSION, "format": "mmap", "count": 3, "classes": ["a", "b"],
         "store": "pixels", "shape": [4, 5, 3], "checksum": "xxh3_64", "keys_file": "keys.json",
         "files": {"images.npy": {"bytes": 188, "xxh3_64": "00ff00ff00ff00ff"}}, "skipped": [], "options": {}}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def _int(v, low=None) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and (low is None or v >= low)


def _file_ok(name, meta) -> bool:
    return (isinstance(name, str) and bool(name) and "\0" not in name and not os.path.isabs(name)
            and ".." not in Path(name).parts
            and isinstance(meta, dict) and _int(meta.get("bytes"), 0) and isinstance(meta.get("xxh3_64"), str))


def follows_contract(m) -> bool:
    """The documented manifest rules, written independently of pixfeed.manifest.validate."""
    if not isinstance(m, dict) or m.get("magic") != MAGIC or not _int(m.get("layout_version")):
        return False
    shape, classes, files = m.get("shape"), m.get("classes"), m.get("files")
    return (m["layout_version"] == LAYOUT_VERSION and m.get("format") in sorted(FORMATS) and m.get("store") in STORES
            and _int(m.get("count"), 0)
            and (classes is None or isinstance(classes, list) and all(isinstance(c, str) for c in classes))
            and (m["store"] != "pixels" or isinstance(shape, list) and len(shape) == 3 and shape[2] == 3
                 and all(_int(s, 1) for s in shape))
            and isinstance(files, dict) and all(_file_ok(n, v) for n, v in files.items())
            and _bounded_ok(m))


_OPTIONAL_TYPES = {"keys_file": str, "checksum": str, "key_index": dict, "shards": list, "per_box": list,
                   "skipped": list, "notes": list, "source": dict, "options": dict, "chunks": dict,
                   "created": str, "pixfeed_version": str}


def _bounded_ok(m) -> bool:
    """#39's rules: optional entries of their types, a count no more than the files' bytes, a pixels record
    of at most 1 GiB, and a keys_file naming a file inside the dataset."""
    if any(m.get(k) is not None and not isinstance(m[k], t) for k, t in _OPTIONAL_TYPES.items()):
        return False
    if "classes" not in m or "shape" not in m:
        return False
    if m["count"] > sum(v["bytes"] for v in m["files"].values()):
        return False
    if m["store"] == "pixels" and m["shape"][0] * m["shape"][1] * 3 > 1 << 30:
        return False
    if m["store"] != "pixels" and m["shape"] is not None:  # #43: a shape only in pixels mode
        return False
    if not all(isinstance(s, dict) and isinstance(s.get("path"), str) and isinstance(s.get("reason"), str)
               for s in m.get("skipped") or []):  # #43: what `pixfeed info` prints of each skipped file
        return False
    if max(m["count"], sum(v["bytes"] for v in m["files"].values())) > (1 << 63) - 1:  # #43: int64 sizes
        return False
    keys = m.get("keys_file")
    return "keys_file" not in m or (isinstance(keys, str) and bool(keys) and not os.path.isabs(keys)
                                    and ".." not in Path(keys).parts)


def check(text) -> None:
    try:
        expected = json.loads(text)
    except (ValueError, RecursionError):
        expected = DatasetError
    try:
        got = parse_manifest(text, WHERE)
    except DatasetError as e:
        assert str(e).startswith(f"{WHERE}: ") and len(str(e)) > len(WHERE) + 10
        assert expected is DatasetError or not follows_contract(expected), f"valid manifest refused: {e}"
        return
    assert follows_contract(expected) and got == expected


@given(st.binary(max_size=300))
def test_random_bytes(data):
    check(data)


@given(json_values)
def test_random_json(value):
    check(json.dumps(value))


@settings(max_examples=300)
@given(st.sampled_from(sorted(VALID)), json_values | st.sampled_from([*FORMATS, *STORES, LAYOUT_VERSION, 0, -1]),
       st.booleans())
def test_one_field_changed_or_removed(field, value, remove):
    m = dict(VALID)
    if remove:
        del m[field]
    else:
        m[field] = value
    check(json.dumps(m))


@given(st.dictionaries(st.text(max_size=12) | st.sampled_from(["/abs", "a/../b", "..", "ok.bin"]),
                       st.fixed_dictionaries({"bytes": json_values, "xxh3_64": json_values}), max_size=3))
def test_file_tables(files):
    check(json.dumps({**VALID, "files": files}))


def test_valid_manifest_and_deep_nesting():
    check(json.dumps(VALID))
    for size in (-1, True):
        check(json.dumps({**VALID, "files": {"images.npy": {"bytes": size, "xxh3_64": "00"}}}))
    check("[" * 100_000 + "]" * 100_000)


@settings(max_examples=60)
@given(st.binary(max_size=200) | st.builds(json.dumps, json_values).map(str.encode)
       | st.sampled_from(sorted(VALID)).map(lambda k: json.dumps({**VALID, k: None}).encode()))
@example(b"[" * 100_000)  # json's RecursionError: DatasetError from both
def test_read_manifest_is_parse_manifest_on_a_file(data):
    """read_manifest has no parser of its own: on any file it does what parse_manifest does."""
    import tempfile

    from pixfeed.manifest import read_manifest

    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "pixfeed.json"
        path.write_bytes(data)
        outcomes = []
        for parse in (lambda: read_manifest(root), lambda: parse_manifest(data, path)):
            try:
                outcomes.append(parse())
            except DatasetError as e:
                outcomes.append(str(e))
    assert outcomes[0] == outcomes[1]
