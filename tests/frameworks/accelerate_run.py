"""Accelerate, two ways: ``torchrun --nproc-per-node 2 accelerate_run.py OUT WDS`` or one process
(``python accelerate_run.py OUT WDS``).  Saves, per rank, the samples of 2 epochs of every case."""
from __future__ import annotations

import sys
from pathlib import Path

from accelerate import Accelerator, DataLoaderConfiguration

from common import BATCH, SEED, datasets, epochs, save
from pixfeed import make_loader

CONFIGS = {  # Accelerate's ways of splitting a prepared loader
    "default": {},
    "split_batches": {"split_batches": True},
    "dispatch": {"dispatch_batches": True},
    "no_dispatch": {"dispatch_batches": False},
}


def loaders(wds: str):
    return {kind: make_loader(dataset, BATCH, seed=SEED) for kind, dataset in datasets(wds).items()}


def main(out: Path, wds: str) -> None:
    before = {config: loaders(wds) for config in CONFIGS}  # no process group yet
    accelerator = Accelerator(cpu=True)
    results = {}
    if accelerator.num_processes == 1:  # alone and through prepare: the same samples
        results["alone"] = {kind: epochs(loader) for kind, loader in loaders(wds).items()}
    for config, options in CONFIGS.items():
        prepare = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**options)).prepare
        for when, made in (("before", before[config]), ("after", loaders(wds))):
            for kind, loader in made.items():
                results[f"{config}/{when}/{kind}"] = epochs(prepare(loader))
    save(results, out / f"rank{accelerator.process_index}.pt")
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
