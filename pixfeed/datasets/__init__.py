"""Datasets, one per format, returning ``(uint8 CHW RGB tensor, int label)``."""
from .base import ImageRecords, MapImageDataset
from .mmap import MmapImageDataset
from .open import open_dataset

__all__ = ["ImageRecords", "MapImageDataset", "MmapImageDataset", "open_dataset"]
