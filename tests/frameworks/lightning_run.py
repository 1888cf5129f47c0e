"""Lightning: ``python lightning_run.py OUT WDS``.  First one process (``devices=1``), then ``ddp`` on 2
CPU processes (Lightning starts the second by running this script again): loaders made before the
process group exists and passed to ``fit``, made in ``train_dataloader`` after it exists, and from
``PixfeedDataModule``.  Saves, per rank, the samples of 2 epochs of every case."""
from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

import lightning.pytorch as pl
import torch

from common import BATCH, COUNT, SEED, datasets, epochs, identities, save
from pixfeed import make_loader
from pixfeed.loaders._testing import ArrayDataset, random_images
from pixfeed.loaders.datamodule import PixfeedDataModule


class Recorder(pl.LightningModule):
    """Records the samples of every batch, per loader and epoch; ``loaders`` made in the hook if callable."""

    def __init__(self, loaders=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.loaders, self.seen = loaders, defaultdict(lambda: [[], []])

    def train_dataloader(self):
        return self.loaders()

    def training_step(self, batch, batch_idx):
        batches = batch if isinstance(batch, dict) else {"datamodule": batch}
        for name, part in batches.items():
            self.seen[name][self.current_epoch] += identities(part)
        return self.weight * sum(part[0].float().mean() for part in batches.values())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Predictor(pl.LightningModule):
    """Predicts each sample's identity."""

    def predict_step(self, batch, batch_idx):
        return identities(batch)


def predict(**options):
    """Every sample this rank predicted with ``trainer.predict`` on 2 devices (ddp), through
    ``make_loader(dataset, BATCH, shuffle=False, **options)``."""
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                         enable_model_summary=False)
    loader = make_loader(ArrayDataset(random_images(COUNT, 6, 6)), BATCH, shuffle=False, **options)
    return sum(trainer.predict(Predictor(), loader), [])


def loaders(wds: str):
    return {kind: make_loader(dataset, BATCH, seed=SEED) for kind, dataset in datasets(wds).items()}


def fit(module, devices, strategy="auto", **data):
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, **data)
    return trainer, dict(module.seen)


def main(out: Path, wds: str) -> None:
    results = {}
    if "LOCAL_RANK" not in os.environ:  # the first process, before Lightning starts the second
        results["alone"] = {kind: epochs(loader) for kind, loader in loaders(wds).items()}
        _, results["single"] = fit(Recorder(), 1, train_dataloaders=loaders(wds))
    before = loaders(wds)  # no process group yet: Lightning creates it in fit
    trainer, results["before"] = fit(Recorder(), 2, "ddp", train_dataloaders=before)
    _, results["after"] = fit(Recorder(lambda: loaders(wds)), 2, "ddp")
    module = PixfeedDataModule(datasets(wds)["map"], BATCH, seed=SEED)
    _, results["datamodule"] = fit(Recorder(), 2, "ddp", datamodule=module)
    results["predict"] = {"defaults": predict(), "distributed=False": predict(distributed=False)}
    save(results, out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
