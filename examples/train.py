"""A small, real training loop that survives being killed: python examples/train.py DATA CKPT_DIR.

A tiny CNN on CPU, DDP over gloo when started by ``torchrun`` (one process
otherwise).  Every ``--every`` steps rank 0 writes model, optimizer and loader
state to ``CKPT_DIR/last.pt`` (to a temporary name, then renamed, so a kill
never leaves half a checkpoint).  ``--resume`` continues from it, on any number
of ranks: the loader resumes in the middle of its epoch
(``loader.load_state_dict``).  ``--read-log`` appends, per rank and step, the epoch,
step and a hash of every image of the batch (``tests/test_train_example.py``
uses it to check that an interrupted and resumed run read one epoch exactly).

    torchrun --nproc-per-node 2 examples/train.py DATA ckpt --epochs 2
    torchrun --nproc-per-node 3 examples/train.py DATA ckpt --epochs 2 --resume
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import pixfeed


def options(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="a packed pixfeed dataset")
    parser.add_argument("ckpt", type=Path, help="checkpoint directory")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--size", type=int, default=16, help="random-resized crop size")
    parser.add_argument("--workers", default="auto", help="DataLoader workers (an integer or auto)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    parser.add_argument("--resume", action="store_true", help="continue from CKPT/last.pt")
    parser.add_argument("--read-log", type=Path, help="append what each rank read, one JSON line per step")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    return parser.parse_args(argv)


def build_loader(args: argparse.Namespace, distributed: bool):
    dataset = pixfeed.open_dataset(args.data, size=args.size, crop="random")
    workers = args.workers if args.workers == "auto" else int(args.workers)
    return pixfeed.make_loader(dataset, args.batch_size, num_workers=workers, seed=args.seed,
                               distributed=distributed)


def image_ids(images: torch.Tensor) -> list:
    return [hashlib.blake2b(x.contiguous().numpy().tobytes(), digest_size=8).hexdigest() for x in images]


def main(argv=None) -> None:
    args = options(argv)
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10))
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = build_loader(args, dist.is_initialized())
    net = model.module if dist.is_initialized() else model  # checkpoints without DDP's "module." prefix
    step, path = 0, args.ckpt / "last.pt"
    if args.resume and path.exists():
        state = torch.load(path, weights_only=True)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
    log = open(args.read_log, "a") if args.read_log else None
    while loader.epoch < args.epochs:
        epoch = loader.epoch
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images.float() / 255), labels % 10)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            time.sleep(args.step_sleep)
            if log:
                print(json.dumps({"rank": rank, "epoch": epoch, "step": step, "ids": image_ids(images)}),
                      file=log, flush=True)
            if step % args.every == 0:
                save(args.ckpt, rank, {"model": net.state_dict(), "optimizer": optimizer.state_dict(),
                                       "loader": loader.state_dict(), "step": step})
    if dist.is_initialized():
        dist.destroy_process_group()


def save(directory: Path, rank: int, state: dict) -> None:
    """Rank 0 writes the checkpoint (ranks take batches in step, so its loader state speaks for all)."""
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".last.pt.tmp-{os.getpid()}"
        torch.save(state, tmp)
        os.replace(tmp, directory / "last.pt")


if __name__ == "__main__":
    main()
