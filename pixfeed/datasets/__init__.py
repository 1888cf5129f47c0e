"""Datasets, one per format, returning ``(uint8 CHW RGB tensor, int label)``.

The reader classes are named by ``pixfeed.registry`` and imported on first
use, so reading an mmap dataset never imports lmdb, h5py or webdataset.
"""
from ..registry import FORMATS
from .base import ImageRecords, MapImageDataset
from .open import open_dataset

_READERS = {f.reader_name: name for name, f in FORMATS.items()}
__all__ = sorted(["ImageRecords", "MapImageDataset", "open_dataset", *_READERS])


def __getattr__(name: str):
    if name in _READERS:
        from ..registry import reader_class

        return reader_class(_READERS[name])
    raise AttributeError(f"module 'pixfeed.datasets' has no attribute {name!r}")
