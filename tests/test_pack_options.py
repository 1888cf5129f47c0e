"""Format-specific pack options are refused for a format that does not take
them (API and CLI), only the options that applied are recorded, and a pack
reads each source file once."""
from __future__ import annotations

import builtins
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
    common = {"store", "size", "resize", "max_side", "quality", "ext", "on_error", "max_pixels", "full_check"}
    own = {"mmap": set(), "lmdb": set(), "hdf5": {"compression"}, "wds": {"shard_size", "shard_bytes", "shuffle",
                                                                           "seed"}}
    for fmt, extra in own.items():
        m = pixfeed.pack(image_tree, tmp_path / fmt, fmt, size=8, workers=1)
        assert set(m["options"]) == common | extra, fmt
    assert m["options"]["shuffle"] is True and m["options"]["seed"] == 0  # wds's defaults, filled in


def test_wds_reads_each_source_file_once_and_records_its_shape(image_tree, tmp_path, monkeypatch):
    opened, real = [], builtins.open

    def counting(file, *args, **kwargs):
        if Path(str(file)).is_relative_to(image_tree):
            opened.append(Path(file).relative_to(image_tree).as_posix())
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
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
