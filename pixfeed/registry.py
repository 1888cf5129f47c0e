"""Format name -> writer and reader, as import strings so that ``import pixfeed``
does not import lmdb, h5py or webdataset.  A new format adds one line here."""
from __future__ import annotations

import importlib

from .errors import OptionError

FORMATS = {
    # name: (writer "module:Class", reader "module:Class")
    "mmap": ("pixfeed.packers.mmap:MmapWriter", "pixfeed.datasets.mmap:MmapImageDataset"),
    "wds": ("pixfeed.packers.wds:WdsWriter", "pixfeed.datasets.wds:WdsImageDataset"),
    "lmdb": ("pixfeed.packers.lmdb:LmdbWriter", "pixfeed.datasets.lmdb:LmdbImageDataset"),
    "hdf5": ("pixfeed.packers.hdf5:H5Writer", "pixfeed.datasets.hdf5:H5ImageDataset"),
}
KNOWN = ("mmap", "lmdb", "hdf5", "wds")


def _load(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _entry(name: str, which: int):
    if name not in FORMATS:
        if name in KNOWN:
            raise OptionError(f"format {name!r} is not implemented yet; available: {', '.join(FORMATS)}")
        raise OptionError(f"format {name!r}: unknown; expected one of {', '.join(KNOWN)}")
    return _load(FORMATS[name][which])


def writer_class(name: str):
    return _entry(name, 0)


def reader_class(name: str):
    return _entry(name, 1)
