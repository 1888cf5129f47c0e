"""The one list of formats: name -> writer, reader, default store, options, layout.

Every other list of formats is derived from ``FORMATS``: the manifest's
validation, the CLI's ``--format`` choices, ``pixfeed``'s and
``pixfeed.datasets``' exports, ``pack``'s option check and the benchmark's
default formats.  Writers and readers are import strings, so ``import
pixfeed`` does not import lmdb, h5py or webdataset.

A fifth format adds a writer module (``pixfeed/packers/NAME.py``), a reader
module (``pixfeed/datasets/NAME.py``), a layout module of its on-disk
constants that both import (``pixfeed/layouts/NAME.py``) and one entry here.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Dict, List, Mapping

from .errors import OptionError


@dataclass(frozen=True)
class Format:
    name: str
    writer: str                    # "module:Class" of its pixfeed.packers.writer.Writer
    reader: str                    # "module:Class" of its dataset
    layout: str                    # module of its on-disk constants, imported by writer and reader
    default_store: str = "encoded"
    # pack options only this format takes, with their defaults (None: unset)
    options: Mapping[str, object] = field(default_factory=dict)

    @property
    def reader_name(self) -> str:
        return self.reader.rpartition(":")[2]


FORMATS: Dict[str, Format] = {f.name: f for f in (
    Format("mmap", "pixfeed.packers.mmap:MmapWriter", "pixfeed.datasets.mmap:MmapImageDataset",
           "pixfeed.layouts.mmap", default_store="pixels"),
    Format("lmdb", "pixfeed.packers.lmdb:LmdbWriter", "pixfeed.datasets.lmdb:LmdbImageDataset",
           "pixfeed.layouts.lmdb"),
    Format("hdf5", "pixfeed.packers.hdf5:H5Writer", "pixfeed.datasets.hdf5:H5ImageDataset",
           "pixfeed.layouts.hdf5", options={"compression": None}),
    Format("wds", "pixfeed.packers.wds:WdsWriter", "pixfeed.datasets.wds:WdsImageDataset",
           "pixfeed.layouts.wds", options={"shard_size": None, "shard_bytes": None, "shuffle": True, "seed": 0}),
)}


def get(name: str) -> Format:
    if name not in FORMATS:
        raise OptionError(f"format {name!r}: unknown; expected one of {', '.join(FORMATS)}")
    return FORMATS[name]


def format_options() -> Dict[str, List[str]]:
    """Every format-specific option -> the formats that take it."""
    out: Dict[str, List[str]] = {}
    for f in FORMATS.values():
        for option in f.options:
            out.setdefault(option, []).append(f.name)
    return out


def _load(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def writer_class(name: str):
    return _load(get(name).writer)


def reader_class(name: str):
    return _load(get(name).reader)
