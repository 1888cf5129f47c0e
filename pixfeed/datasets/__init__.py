"""Datasets, one per format, returning ``(uint8 CHW RGB tensor, int label)``."""
from .base import ImageRecords, MapImageDataset
from .hdf5 import H5ImageDataset
from .lmdb import LmdbImageDataset
from .mmap import MmapImageDataset
from .open import open_dataset
from .wds import WdsImageDataset

__all__ = ["H5ImageDataset", "ImageRecords", "LmdbImageDataset", "MapImageDataset", "MmapImageDataset",
           "WdsImageDataset", "open_dataset"]
