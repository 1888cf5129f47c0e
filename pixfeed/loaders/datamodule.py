"""``PixfeedDataModule``: a Lightning ``LightningDataModule`` over pixfeed datasets.

Lightning calls ``train_dataloader``/``val_dataloader`` after it has created
the process group, so the loaders ``make_loader`` builds there split by rank
from the first epoch; Lightning keeps their sampler (a ``DistributedSampler``)
and calls its ``set_epoch`` every epoch.  Needs ``lightning`` (not a
dependency of pixfeed): ``pip install lightning``.
"""
from __future__ import annotations

from typing import Any, Optional

import lightning.pytorch as pl

from pixfeed.loaders.loader import PixfeedLoader
from pixfeed.loaders.make import make_loader


class PixfeedDataModule(pl.LightningDataModule):
    """``PixfeedDataModule(train, batch_size, val=None, **make_loader_options)``; validation is not shuffled."""

    def __init__(self, train: Any, batch_size: int, val: Optional[Any] = None, **options: Any) -> None:
        super().__init__()
        self.train, self.val, self.batch_size, self.options = train, val, batch_size, options

    def train_dataloader(self) -> PixfeedLoader:
        return make_loader(self.train, self.batch_size, **self.options)

    def val_dataloader(self) -> Any:
        if self.val is None:
            return []
        return make_loader(self.val, self.batch_size, **{**self.options, "shuffle": False})
