"""What the loaders and tools rely on from a dataset, as ``typing.Protocol`` classes.

pixfeed's datasets implement them; a user's dataset may implement any of
them to get the same treatment from ``make_loader`` (``pixfeed.loaders.plan``),
and none to be read as a plain map-style or iterable dataset.
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class ShapedDataset(Protocol):
    """Knows the shape its images come out at."""

    @property
    def fixed_shape(self) -> Optional[Tuple[int, int, int]]:
        """(3, H, W) when every image comes out at one shape (before any transform), else None."""


@runtime_checkable
class CostedDataset(Protocol):
    """Knows whether reading costs CPU work per sample (without it, pixfeed assumes it does)."""

    @property
    def cpu_bound(self) -> bool:
        """False when reading a sample needs no CPU work beyond a copy (read it in process)."""


@runtime_checkable
class BatchDataset(ShapedDataset, Protocol):
    """Reads a whole batch in one call (the loaders' batch path, when ``fixed_shape`` is known)."""

    def get_batch(self, indices: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(uint8 N x 3 x H x W images, int64 labels) for ``indices``."""


@runtime_checkable
class CheckedReads(Protocol):
    """Reads stored records with their checksums checked (``pixfeed verify``, the profiler)."""

    def read_stored(self, indices: np.ndarray) -> Tuple[Any, Any, Any]:
        """(stored records, labels, checksums) of valid indices, unchecked."""

    def read_checked(self, indices: Sequence[int]) -> Tuple[np.ndarray, Any, Any]:
        """(non-negative indices, stored records, labels), every checksum checked."""

    def check_files(self) -> None:
        """Raise unless every data file is present at its recorded size."""


@runtime_checkable
class EpochDataset(Protocol):
    """Changes with the epoch: the loader calls ``set_epoch`` before each."""

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass over the dataset epoch ``epoch``."""


@runtime_checkable
class SharedEpochDataset(EpochDataset, Protocol):
    """Keeps its epoch where persistent workers see ``set_epoch`` (when ``epoch_in_shared_memory``)."""
    epoch_in_shared_memory: bool


def reads_in_process(dataset: Any) -> bool:
    """Whether ``dataset`` declares that reading it needs no per-sample CPU work."""
    return isinstance(dataset, CostedDataset) and not dataset.cpu_bound


def epoch_needs_fresh_workers(dataset: Any) -> bool:
    """Whether persistent workers would miss the dataset's ``set_epoch``."""
    return isinstance(dataset, EpochDataset) and not (
        isinstance(dataset, SharedEpochDataset) and dataset.epoch_in_shared_memory)
