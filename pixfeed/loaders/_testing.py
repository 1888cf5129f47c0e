"""A NumPy-backed dataset that follows the MapImageDataset contract.

For tests and benchmarks of the loaders; any real pixfeed dataset behaves the
same way as far as ``make_loader`` is concerned.  Images are stored NHWC uint8
and returned as CHW views, labels are the sample indices unless given.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset


class ArrayDataset(Dataset):
    def __init__(self, images: np.ndarray, labels: Optional[np.ndarray] = None, *, augment: bool = False) -> None:
        self.images = images
        self.labels = np.arange(len(images), dtype=np.int64) if labels is None else labels
        self.augment = augment
        self.cpu_bound = augment
        self.deterministic = not augment
        self.fixed_shape: Optional[Tuple[int, int, int]] = (images.shape[3], images.shape[1], images.shape[2])
        self.batch_calls = 0

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        image = torch.from_numpy(np.array(self.images[index])).permute(2, 0, 1)
        if self.augment:  # a random brightness shift, drawn from torch's global RNG
            image = image + torch.randint(0, 50, ()).to(torch.uint8)
        return image, int(self.labels[index])

    def __getitems__(self, indices: List[int]) -> List[Tuple[torch.Tensor, int]]:
        self.batch_calls += 1
        return [self[i] for i in indices]

    def get_batch(self, indices: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        self.batch_calls += 1
        order = np.asarray(indices, dtype=np.int64)
        if self.augment:
            images = torch.stack([self[i][0] for i in indices])
        else:  # row by row: each row copy releases the GIL, unlike one fancy-indexed gather
            rows = np.empty((len(order), *self.images.shape[1:]), dtype=np.uint8)
            for row, index in zip(rows, order):
                row[...] = self.images[index]
            images = torch.from_numpy(rows).permute(0, 3, 1, 2)
        return images, torch.from_numpy(self.labels[order])


def random_images(count: int, height: int = 8, width: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, height, width, 3), dtype=np.uint8)
