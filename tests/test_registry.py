"""One source of truth per format: every list of formats is derived from
``pixfeed.registry.FORMATS``; a registered fifth format packs, validates and
opens through the CLI with no other change; each format's writer and reader
share its layout module; format-specific options are refused elsewhere."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import pixfeed
import pixfeed.datasets
from pixfeed import registry
from pixfeed.bench.runner import BenchConfig
from pixfeed.cli import build_parser, main
from pixfeed.datasets import MmapImageDataset, open_dataset
from pixfeed.errors import DatasetError
from pixfeed.manifest import validate
from pixfeed.packers.mmap import MmapWriter


class FakeDataset(MmapImageDataset):
    """A "fifth format": the mmap layout under another name, taking wds's --seed."""
    format = "fake"


FAKE = registry.Format("fake", "pixfeed.packers.mmap:MmapWriter", "test_registry:FakeDataset",
                       "pixfeed.layouts.mmap", default_store="pixels", options={"seed": 5})


def _choices(parser, command: str, flag: str) -> list:
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return list(next(a for a in sub._actions if flag in a.option_strings).choices)


def test_every_list_of_formats_is_the_registry():
    names = list(registry.FORMATS)
    assert names == ["mmap", "lmdb", "hdf5", "wds"]
    assert _choices(build_parser(), "pack", "--format") == names
    assert list(BenchConfig().formats) == names
    readers = {f.reader_name for f in registry.FORMATS.values()}
    assert readers <= set(pixfeed.__all__) and readers <= set(pixfeed.datasets.__all__)
    for name, f in registry.FORMATS.items():
        assert getattr(pixfeed, f.reader_name) is registry.reader_class(name)
        validate(_manifest(name), "m")
    with pytest.raises(DatasetError, match="unknown format 'zip'; expected one of mmap, lmdb, hdf5, wds"):
        validate(_manifest("zip"), "m")


def _manifest(fmt: str) -> dict:
    return {"magic": "pixfeed-dataset", "layout_version": 1, "format": fmt, "count": 0, "classes": None, "shape": None,
            "store": "encoded", "files": {}}


def test_a_registered_fifth_format_packs_and_opens_through_the_cli(image_tree, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(registry.FORMATS, "fake", FAKE)
    dst = tmp_path / "fake"
    assert main(["pack", "--format", "fake", "--size", "8", "--workers", "1", "-q", str(image_tree), str(dst)]) == 0
    m = json.loads((dst / "pixfeed.json").read_text())
    assert m["format"] == "fake" and m["options"]["seed"] == 5 and "shard_size" not in m["options"]
    ds = open_dataset(dst)
    assert type(ds) is FakeDataset and ds[0][0].shape == (3, 8, 8)
    assert main(["info", str(dst)]) == 0 and "fake (layout version 2)" in capsys.readouterr().out
    with pytest.raises(pixfeed.errors.OptionError, match=r"--seed \(seed=\) applies to format wds and fake only, "
                                                         r"not mmap"):
        pixfeed.pack(image_tree, tmp_path / "m", "mmap", seed=1)


@pytest.mark.parametrize("name", list(registry.FORMATS))
def test_writer_and_reader_share_the_layout_module(name):
    f = registry.FORMATS[name]
    layout = importlib.import_module(f.layout)
    assert "Reading" in layout.__doc__  # how to read it with the plain library
    for spec in (f.writer, f.reader):
        module = vars(importlib.import_module(spec.partition(":")[0]))
        assert any(v is layout or getattr(v, "__module__", None) == f.layout for v in module.values()), spec
    assert MmapWriter not in registry.writer_class(name).__mro__[1:]  # no format inherits another's files


def test_import_pixfeed_and_its_cli_import_no_format_library():
    code = ("import sys, pixfeed, pixfeed.datasets; from pixfeed.cli import build_parser; build_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'lmdb', 'h5py', 'webdataset'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
