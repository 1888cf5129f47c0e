"""Fault injection: a loader ends in a clear error (or reads on) and never waits forever.

Real faults, not mocks: a worker killed with SIGKILL or stopped with SIGSTOP, a
read that blocks on a FIFO, a worker over a cgroup memory limit, a 1 MiB
/dev/shm in a private mount namespace (root only; skipped otherwise).  Every
wait here has a deadline far above the documented bound, so a regression fails
instead of hanging the suite.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import make_tree
from torch.utils.data import get_worker_info

from pixfeed.datasets import open_dataset
from pixfeed.errors import LoaderStalledError, WorkerDiedError
from pixfeed.loaders import make_loader
from pixfeed.loaders._testing import ArrayDataset, random_images
from pixfeed.packers import pack

STALL_S = 1.0  # stall_timeout in these tests
BOUND_S = 10.0  # every fault must end in its error within this, load included
# one run of the tiny-/dev/shm child: two workers started and 8 batches read beside spinning processes; on a
# loaded 2-CPU machine a run that works took 10.9 s, while a stall never ends (the child's timeout is 300 s)
SHM_RUN_BOUND_S = 45.0
CHILD = Path(__file__).with_name("fault_child.py")
TINY_SHM = "mount -t tmpfs -o size=1m tmpfs /dev/shm"  # in a private mount namespace: this test's alone


class Fault:
    """Misbehaves on its ``at``-th call in worker 0 (or in process): kill or stop it, or block in a FIFO read."""

    def __init__(self, kind: str, at: int, fifo: Path) -> None:
        self.kind, self.at, self.fifo, self.calls = kind, at, fifo, 0

    def __call__(self, image: torch.Tensor = None) -> torch.Tensor:
        self.calls += 1
        worker = get_worker_info()
        if self.calls == self.at and (worker is None or worker.id == 0):
            if self.kind == "block":  # O_RDWR: open returns, the read waits for a writer that never writes
                os.read(os.open(self.fifo, os.O_RDWR), 1)
            else:
                assert worker is not None, "never kill or stop the test process itself"
                os.kill(os.getpid(), signal.SIGKILL if self.kind == "kill" else signal.SIGSTOP)
        return image


class FaultyArray(ArrayDataset):
    def __init__(self, fault: Fault) -> None:
        super().__init__(random_images(48), augment=True)
        self.fault = fault

    def __getitem__(self, index: int):
        if index == 20:  # batch 2 of 8 in order
            self.fault()
        return super().__getitem__(index)


@pytest.fixture(scope="module")
def wds_path(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("wds")
    pack(make_tree(root / "src", per_class=8), root / "wds", "wds", store="pixels", size=16, shard_size=6, workers=1)
    return str(root / "wds")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "storage.fifo"
    os.mkfifo(path)
    yield path
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK) if _has_reader(path) else None
    if writer is not None:  # release an in-process reader thread still blocked in it
        os.write(writer, b"x" * 8)
        os.close(writer)


def _has_reader(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        return True
    except OSError:
        return False


def faulty_loader(kind: str, fmt: str, workers: int, fifo: Path, wds_path: str):
    if fmt == "map":
        dataset = FaultyArray(Fault(kind, 1, fifo))
    else:  # the real WebDataset reader, the fault in its transform (called once per sample)
        dataset = open_dataset(wds_path, transform=Fault(kind, 5, fifo), shuffle=False)
    return make_loader(dataset, 8, shuffle=False, num_workers=workers, stall_timeout=STALL_S)


def run_until_error(loader) -> tuple:
    start, error = time.monotonic(), None
    try:
        for _ in loader:
            pass
    except Exception as e:  # noqa: BLE001 - the test inspects it
        error = e
    return error, time.monotonic() - start


@pytest.mark.parametrize("fmt", ["map", "wds"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_read_that_blocks_forever_raises_naming_the_file(fifo, wds_path, fmt, workers):
    error, seconds = run_until_error(faulty_loader("block", fmt, workers, fifo, wds_path))
    assert isinstance(error, LoaderStalledError), error
    assert seconds < BOUND_S
    assert f"made no progress for {STALL_S:g} s" in str(error) and f"its read of {fifo} does not return" in str(error)
    assert ("records [16, 17, 18, 19] and 4 more" if fmt == "map" else "of the stream") in str(error)
    assert ("worker" if workers else "in-process reader") in str(error)


@pytest.mark.parametrize("fmt", ["map", "wds"])
def test_a_worker_killed_mid_epoch_raises_naming_it_and_its_batch(fifo, wds_path, fmt):
    error, seconds = run_until_error(faulty_loader("kill", fmt, 2, fifo, wds_path))
    assert isinstance(error, WorkerDiedError), error
    assert seconds < BOUND_S
    assert "was killed by SIGKILL: likely the out-of-memory killer (see dmesg) or a kill -9" in str(error)
    assert ("batch 2: records [16, 17, 18, 19]" if fmt == "map" else "of the stream") in str(error)


def test_a_stopped_worker_raises_and_is_ended(fifo, wds_path):
    loader = faulty_loader("stop", "map", 2, fifo, wds_path)
    error, seconds = run_until_error(loader)
    assert isinstance(error, LoaderStalledError), error
    assert seconds < BOUND_S and "state T" in str(error) and "it is stopped (SIGSTOP" in str(error)
    pid = int(str(error).split("(pid ")[1].split(")")[0])
    deadline = time.monotonic() + BOUND_S
    while _alive(pid) and time.monotonic() < deadline:  # killed, so shutdown and exit cannot hang on it
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


class Slow(ArrayDataset):
    """Record 5 takes 3 x stall_timeout: reading a file slowly, then computing."""

    def __init__(self, path: Path) -> None:
        super().__init__(random_images(16), augment=True)
        self.path = path

    def __getitem__(self, index: int):
        if index == 5:
            with open(self.path, "rb", buffering=0) as f:
                for _ in range(int(STALL_S * 1.5 / 0.1)):  # a slow network read: small pieces, pauses
                    f.read(16)
                    time.sleep(0.1)
            end = time.monotonic() + STALL_S * 1.5
            while time.monotonic() < end:  # a long decode
                pass
        return super().__getitem__(index)


@pytest.mark.parametrize("workers", [0, 2])
def test_slow_but_progressing_reads_are_not_a_stall(tmp_path, workers):
    (tmp_path / "data").write_bytes(os.urandom(4096))
    loader = make_loader(Slow(tmp_path / "data"), 4, shuffle=False, num_workers=workers, stall_timeout=STALL_S)
    assert sorted(int(x) for _, labels in loader for x in labels) == list(range(16))


def child(*args: str, namespace: str = "") -> dict:
    command = [sys.executable, str(CHILD), *args]
    if namespace:
        command = ["unshare", "-m", "sh", "-c", f"{namespace} && exec {' '.join(command)}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if result.returncode == 77:
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_tiny_dev_shm_never_stalls_idle_or_busy():
    probe = subprocess.run(["unshare", "-m", "sh", "-c", TINY_SHM], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"a 1 MiB /dev/shm needs a private mount namespace (root): {probe.stderr.strip()}")
    runs = child("shm", namespace=TINY_SHM)
    for load in ("idle", "busy"):
        assert len(runs[load]) == 20
        for run in runs[load]:
            assert run["seconds"] < SHM_RUN_BOUND_S, run
            assert run["outcome"] == "all batches" or run["outcome"].startswith("SharedMemoryError"), run
    outcomes = [run["outcome"] for run in runs["idle"] + runs["busy"]]
    assert any("could not place its batch in shared memory" in o or "could not start" in o for o in outcomes)


def test_a_worker_over_the_memory_limit_raises_naming_the_oom_killer():
    result = child("oom")
    group, deadline = Path(result["group"]), time.monotonic() + 30
    while group.exists() and time.monotonic() < deadline:  # empty once the child's workers are gone
        try:
            group.rmdir()
        except OSError:
            time.sleep(0.1)
    assert result["seconds"] < BOUND_S * 2, result
    assert result["error"].startswith("WorkerDiedError"), result
    assert "out-of-memory killer (the memory cgroup's oom_kill count rose" in result["error"], result


def test_under_ddp_the_rank_that_lost_a_worker_raises_and_the_other_is_bounded_by_the_group_timeout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    ranks = [subprocess.Popen([sys.executable, str(CHILD), "ddp", str(rank), str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for rank in (0, 1)]
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=300)
        assert rank.returncode == 0, err[-3000:]
        results.append(json.loads(out.splitlines()[-1]))
    assert results[1]["error"].startswith("WorkerDiedError: DataLoader worker 0"), results
    assert "killed by SIGKILL" in results[1]["error"] and results[1]["seconds"] < BOUND_S, results
    assert results[0]["error"] != "finished" and results[0]["seconds"] < 5 + BOUND_S, results  # the group timeout
