"""What the framework scripts share: the datasets, and a batch's samples as short hashes."""
from __future__ import annotations

import hashlib
from typing import Dict, List

import torch

from pixfeed.datasets import open_dataset
from pixfeed.loaders._testing import ArrayDataset, random_images

COUNT, BATCH, SEED = 32, 4, 5  # 32 = a whole number of batches on 2 ranks: no padding to allow for


def datasets(wds_path: str) -> Dict[str, object]:
    """A map-style dataset and a WebDataset one, fresh each call."""
    return {"map": ArrayDataset(random_images(COUNT, 6, 6)), "wds": open_dataset(wds_path)}


def identities(batch) -> List[str]:
    images = batch[0]
    return [hashlib.blake2b(image.contiguous().numpy().tobytes(), digest_size=6).hexdigest() for image in images]


def epochs(loader, count: int = 2) -> List[List[str]]:
    """The samples of ``count`` epochs, in order."""
    return [[sample for batch in loader for sample in identities(batch)] for _ in range(count)]


def save(result: dict, path) -> None:
    torch.save(result, path)
