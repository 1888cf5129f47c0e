"""``pixfeed verify`` and readers facing damaged datasets, in every format and store mode:
every problem is found and named (file, shard, key or index); nothing crashes or
returns garbage."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import flip_stored, make_tree, sized
from torch.utils.data import IterableDataset

from pixfeed import registry
from pixfeed.datasets import open_dataset
from pixfeed.image.decode import decode
from pixfeed.errors import CorruptDataError, DatasetError, PixfeedError
from pixfeed.packers import pack
from pixfeed.verify.check import verify

CASES = [(f, s) for f in sorted(registry.FORMATS) for s in ("pixels", "encoded")]
KEY = "dog/img1"  # an RGB PNG in make_tree


@pytest.fixture(params=CASES, ids=["-".join(c) for c in CASES])
def packed(request, tmp_path) -> tuple:
    fmt, store = request.param
    src, dst = make_tree(tmp_path / "src"), tmp_path / "ds"
    pack(src, dst, fmt, store=store, **sized(store, 16), workers=1)
    return src, dst


def _read_all(dst: Path) -> int:
    ds = open_dataset(dst)
    items = ds if isinstance(ds, IterableDataset) else (ds[i] for i in range(len(ds)))
    return sum(1 for _ in items)


def _data_files(dst: Path) -> list:
    files = json.loads((dst / "pixfeed.json").read_text())["files"]
    return sorted((dst / n for n in files if n != "keys.json"), key=lambda p: -p.stat().st_size)


def _stored(src: Path, dst: Path) -> bytes:
    data = (src / f"{KEY}.png").read_bytes()
    store = json.loads((dst / "pixfeed.json").read_text())["store"]
    return decode(data, size=(16, 16), crop_ratio=1.0, exact=True).tobytes() if store == "pixels" else data


def test_a_sound_dataset_passes(packed):
    _, dst = packed
    for deep in (False, True):
        report = verify(dst, deep=deep)
        assert report.ok and report.records == 12 and report.files == len(_data_files(dst)) + 1, report.problems


def test_a_flipped_byte_is_named_by_file_and_key(packed):
    src, dst = packed
    stored = _stored(src, dst)
    path = flip_stored(_data_files(dst), stored)
    if path is None:
        pytest.fail(f"record {KEY} not found as one run of bytes in {dst}")
    problems = verify(dst, deep=True).problems
    assert any(str(path) in p and "xxh3_64" in p for p in problems), problems
    assert any(repr(KEY) in p and "checksum" in p for p in problems), problems
    with pytest.raises(CorruptDataError, match=KEY):
        _read_all(dst)


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_truncated_or_missing_data_file_is_named_and_refused(packed, damage):
    _, dst = packed
    path = _data_files(dst)[0]
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    problems = verify(dst).problems
    assert any(str(path) in p and damage in p for p in problems), problems
    with pytest.raises(PixfeedError, match=str(path)):
        _read_all(dst)


def test_a_count_mismatch_is_reported(packed):
    _, dst = packed
    keys = dst / "keys.json"
    keys.write_text(json.dumps(json.loads(keys.read_text())[:-1]))
    problems = verify(dst).problems
    assert any(str(keys) in p and "11 keys, manifest count is 12" in p for p in problems), problems


def test_unknown_layout_version_is_refused(packed):
    _, dst = packed
    manifest = json.loads((dst / "pixfeed.json").read_text())
    manifest["layout_version"] = 99
    (dst / "pixfeed.json").write_text(json.dumps(manifest))
    for read in (verify, open_dataset):
        with pytest.raises(DatasetError, match="layout_version 99 is not supported"):
            read(dst)


def test_cli_exit_codes_and_messages(tmp_path):
    src, dst = make_tree(tmp_path / "src"), tmp_path / "ds"
    pack(src, dst, "mmap", store="encoded", workers=1)
    (tmp_path / "junk").mkdir()
    data = dst / "data.bin"
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 1
    data.write_bytes(bytes(blob))
    run = lambda *a: subprocess.run([sys.executable, "-m", "pixfeed.cli", "verify", *map(str, a)],
                                    capture_output=True, text=True, check=False)
    bad, missing = run(dst, "--deep"), run(tmp_path / "junk")
    assert bad.returncode == 1 and f"FAIL {data}: xxh3_64" in bad.stdout, bad
    assert "checksum" in bad.stdout.split(f"FAIL {data}")[-1] and "2 problems: " in bad.stdout
    assert missing.returncode == 2 and f"pixfeed: error: {tmp_path / 'junk'}: not a pixfeed dataset" in missing.stderr
