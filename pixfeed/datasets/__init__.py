"""Datasets, one per format, returning ``(uint8 CHW RGB tensor, int label)``.

Format readers are imported on first use (through ``pixfeed.registry``), so
reading an mmap dataset never imports lmdb, h5py or webdataset.
"""
from .base import ImageRecords, MapImageDataset
from .open import open_dataset

_READERS = {"MmapImageDataset": "mmap", "LmdbImageDataset": "lmdb", "H5ImageDataset": "hdf5",
            "WdsImageDataset": "wds"}
__all__ = ["H5ImageDataset", "ImageRecords", "LmdbImageDataset", "MapImageDataset", "MmapImageDataset",
           "WdsImageDataset", "open_dataset"]
assert sorted(__all__) == __all__ and set(_READERS) <= set(__all__)


def __getattr__(name: str):
    if name in _READERS:
        from ..registry import reader_class

        return reader_class(_READERS[name])
    raise AttributeError(f"module 'pixfeed.datasets' has no attribute {name!r}")
