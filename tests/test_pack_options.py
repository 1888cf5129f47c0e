"""Pack options that do not apply to the pack's format or store are refused
(API and CLI), naming what they apply to; only the options that took effect
are recorded, and a pack reads each source file once."""
from __future__ import annotations

import builtins
import os
import json
import sys
from pathlib import Path

import pytest
from PIL import Image

import pixfeed
from pixfeed.cli import main
from pixfeed.datasets import MmapImageDataset, WdsImageDataset
from pixfeed.datasets.protocol import BatchDataset, CheckedReads, SharedEpochDataset
from pixfeed.errors import OptionError

FOREIGN = [("mmap", {"compression": "lzf"}, "--compression", "hdf5"),
           ("hdf5", {"shard_size": 10}, "--shard-size", "wds"),
           ("lmdb", {"shuffle": False}, "--shuffle", "wds"),
           ("wds", {"compression": "gzip"}, "--compression", "hdf5")]


@pytest.mark.parametrize("fmt, option, flag, taker", FOREIGN)
def test_an_option_of_another_format_is_refused_naming_who_takes_it(image_tree, tmp_path, fmt, option, flag, taker):
    with pytest.raises(OptionError, match=f"{flag} .* applies to format {taker} only, not {fmt}"):
        pixfeed.pack(image_tree, tmp_path / "out", fmt, **option)
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_them_too(image_tree, tmp_path, capsys):
    assert main(["pack", "--format", "mmap", "--shard-size", "4", "-q", str(image_tree), str(tmp_path / "o")]) == 2
    assert "--shard-size (shard_size=) applies to format wds only, not mmap" in capsys.readouterr().err
    assert main(["pack", "--format", "hdf5", "--no-shuffle", "-q", str(image_tree), str(tmp_path / "o")]) == 2
    assert "--shuffle (shuffle=) applies to format wds only" in capsys.readouterr().err
    with pytest.raises(OptionError, match="unknown pack option.*shard_sise"):
        pixfeed.pack(image_tree, tmp_path / "o", "wds", shard_sise=3)


def test_only_the_options_that_applied_are_recorded(image_tree, tmp_path):
    common = {"store", "ext", "on_error", "max_pixels"}
    stores = {"pixels": {"size", "resize"}, "encoded": {"full_check", "max_side"}}
    own = {"mmap": set(), "lmdb": set(), "hdf5": {"compression"}, "wds": {"shard_size", "shard_bytes", "shuffle",
                                                                           "seed"}}
    for fmt, extra in own.items():
        for store, applied in stores.items():
            size = {"size": 8} if store == "pixels" else {}
            m = pixfeed.pack(image_tree, tmp_path / f"{fmt}-{store}", fmt, store=store, workers=1, **size)
            expected = common | applied | (extra - ({"compression"} if store == "encoded" else set()))
            assert set(m["options"]) == expected, (fmt, store)
    assert m["options"]["shuffle"] is True and m["options"]["seed"] == 0  # wds's defaults, filled in
    m = pixfeed.pack(image_tree, tmp_path / "384", "mmap", store="encoded", max_side=16, workers=1)
    assert m["options"]["max_side"] == 16 and m["options"]["quality"] == 90 and "size" not in m["options"]
    m = pixfeed.pack(image_tree, tmp_path / "default", "mmap", workers=1)
    assert m["options"]["size"] == [256, 256] and m["options"]["resize"] == "crop" and "max_side" not in m["options"]


# (format, store the pack would use, option given, the store it applies to)
OTHER_STORE = [("lmdb", None, {"size": 224}, "pixels"), ("wds", "encoded", {"resize": "pad"}, "pixels"),
               ("mmap", None, {"max_side": 384}, "encoded"), ("hdf5", "pixels", {"max_side": 64}, "encoded"),
               ("mmap", "pixels", {"full_check": True}, "encoded"), ("hdf5", "encoded", {"compression": "gzip"}, "pixels"),
               ("wds", None, {"size": 64, "resize": "stretch"}, "pixels")]


@pytest.mark.parametrize("fmt, store, option, applies", OTHER_STORE)
def test_an_option_of_the_other_store_is_refused_naming_the_store_it_applies_to(image_tree, tmp_path, fmt, store,
                                                                                option, applies):
    name = next(iter(option))
    flag = "--" + name.replace("_", "-")
    why = "asked for" if store else f"the default of --format {fmt}"
    with pytest.raises(OptionError, match=rf"{flag} \({name}=\) applies to --store {applies} only, and this pack "
                                          rf"stores \w+ \({why}\)"):
        pixfeed.pack(image_tree, tmp_path / "out", fmt, store=store, workers=1, **option)
    assert not (tmp_path / "out").exists()


def test_quality_needs_max_side(image_tree, tmp_path, capsys):
    with pytest.raises(OptionError, match="--quality .*give --max-side N with it"):
        pixfeed.pack(image_tree, tmp_path / "out", "mmap", store="encoded", quality=50)
    assert main(["pack", "--format", "lmdb", "--size", "224", "-q", str(image_tree), str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--size (size=) applies to --store pixels only, and this pack stores encoded (the default of --format " \
           "lmdb)" in err and "Traceback" not in err
    assert main(["pack", "--store", "pixels", "--full-check", "-q", str(image_tree), str(tmp_path / "o")]) == 2
    assert "--full-check (full_check=) applies to --store encoded only" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "out").exists()


def test_wds_reads_each_source_file_once_and_records_its_shape(image_tree, tmp_path, monkeypatch):
    opened = []

    def counting(real):  # source files are read through os.open (bounded.read_file) or open
        def opening(file, *args, **kwargs):
            if isinstance(file, (str, os.PathLike)) and Path(file).is_relative_to(image_tree):
                opened.append(Path(file).relative_to(image_tree).as_posix())
            return real(file, *args, **kwargs)
        return opening

    monkeypatch.setattr(builtins, "open", counting(builtins.open))
    monkeypatch.setattr(os, "open", counting(os.open))
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} read with read_bytes"))
    for store, extra in (("pixels", {"size": 8}), ("encoded", {"max_side": 16})):
        opened.clear()
        pixfeed.pack(image_tree, tmp_path / store, "wds", store=store, workers=1, shuffle=False, **extra)
        assert sorted(opened) == sorted(set(opened)) and len(opened) == 12, store
    monkeypatch.undo()
    for sample in _json_members(tmp_path / "encoded"):
        w, h = Image.open(next(image_tree.glob(sample["key"] + ".*"))).size
        assert sample["size"] == [h, w]


def _json_members(root: Path) -> list:
    import tarfile

    out = []
    for shard in sorted(root.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            out += [json.load(tar.extractfile(m)) for m in tar if m.name.endswith(".json")]
    return out


def test_verify_is_a_deprecated_name_of_checksums(image_tree, tmp_path):
    pixfeed.pack(image_tree, tmp_path / "d", "mmap", size=8, workers=1)
    assert MmapImageDataset(tmp_path / "d", checksums=False).checksums is False
    with pytest.warns(DeprecationWarning, match="checksums="):
        assert MmapImageDataset(tmp_path / "d", verify=False).checksums is False


def test_datasets_declare_the_protocols_the_loaders_and_tools_use(image_tree, tmp_path):
    pixfeed.pack(image_tree, tmp_path / "m", "mmap", size=8, workers=1)
    pixfeed.pack(image_tree, tmp_path / "w", "wds", workers=1)
    mmap, wds = MmapImageDataset(tmp_path / "m"), WdsImageDataset(tmp_path / "w")
    assert isinstance(mmap, BatchDataset) and isinstance(mmap, CheckedReads)
    assert not isinstance(mmap, SharedEpochDataset)
    assert isinstance(wds, SharedEpochDataset) and not isinstance(wds, CheckedReads)


def test_executor_is_checked_and_ray_without_ray_names_the_extra(image_tree, tmp_path, monkeypatch):
    with pytest.raises(OptionError, match="--executor 'dask': expected local or ray"):
        pixfeed.pack(image_tree, tmp_path / "ds", executor="dask")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(OptionError, match=r"--executor ray needs Ray.*pip install 'pixfeed\[ray\]'"):
        pixfeed.pack(image_tree, tmp_path / "ds", executor="ray")
    assert not (tmp_path / "ds").exists()
