"""examples/train.py under torchrun (2 gloo ranks), SIGKILLed at a random step and resumed from its last
checkpoint: together the two runs read exactly the batches (same samples, same random crops, same order
on each rank) of one uninterrupted epoch.  One case (about 40 s here: two torchrun starts); every format,
worker count and WebDataset are resumed in process in test_resume.py."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from conftest import make_tree
from pixfeed.packers import pack

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import train  # noqa: E402

WORLD, DEADLINE_S = 2, 120


def torchrun(args: list, log: Path, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               str(ROOT / "examples" / "train.py"), *args, "--read-log", str(log), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def steps(log: Path) -> list:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def kill_after(process: subprocess.Popen, log: Path, ckpt: Path, step: int) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not (ckpt.exists() and any(s["rank"] == 0 and s["step"] >= step for s in steps(log))):
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the training run never reached the step to kill it at"
        time.sleep(0.05)
    for pid in tree(process.pid):  # torchrun starts each rank in a session of its own
        os.kill(pid, signal.SIGKILL)
    process.wait()


def tree(pid: int) -> list:
    """``pid`` and all its descendants, parents first."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return [pid] + [p for child in children for p in tree(int(child))]


def reference(args: list, monkeypatch) -> dict:
    """What each rank reads in one uninterrupted epoch, from loaders made here with explicit ranks."""
    monkeypatch.setenv("WORLD_SIZE", str(WORLD))
    read = {}
    for rank in range(WORLD):
        monkeypatch.setenv("RANK", str(rank))
        loader = train.build_loader(train.options(args), distributed=True)
        read[rank] = [train.image_ids(images) for images, _ in loader]
    return read


def test_killed_run_resumes_into_exactly_one_epoch(tmp_path, monkeypatch, fmt="mmap", workers=2):
    pack(make_tree(tmp_path / "src", per_class=8), tmp_path / fmt, fmt, store="encoded", workers=1)
    ckpt = tmp_path / "ckpt"
    args = [str(tmp_path / fmt), str(ckpt), "--workers", str(workers), "--batch-size", "2", "--every", "2"]
    kill_at = random.Random().randint(3, 5)  # of 6 steps; checkpoints after steps 2 and 4
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    kill_after(torchrun(args, first, "--step-sleep", "0.3"), first, ckpt, kill_at)
    saved = torch.load(ckpt / "last.pt", weights_only=True)["step"]
    resumed = torchrun(args, second, "--resume")
    assert resumed.wait(DEADLINE_S) == 0, resumed.stderr.read().decode()[-3000:]
    expected = reference(args, monkeypatch)
    for rank in range(WORLD):
        read = [s["ids"] for s in steps(first) if s["rank"] == rank and s["step"] <= saved]
        read += [s["ids"] for s in steps(second) if s["rank"] == rank]
        assert len(read) == len(expected[rank]) == 6, (kill_at, saved, len(steps(first)), len(steps(second)))
        assert read == expected[rank], f"rank {rank}: killed after step {kill_at}, resumed from step {saved}"
