"""make_loader under a real process group: 2 gloo ranks on 127.0.0.1, every available format.

The ranks run once per module (spawned, with a deadline so a hang fails
instead of blocking) and save what they read; the tests check the invariants.
"""
from __future__ import annotations

import socket
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Dict, List

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import IterableDataset

from pixfeed.datasets import open_dataset
from pixfeed.loaders import make_loader
from pixfeed.loaders._testing import ArrayDataset, random_images
from pixfeed.packers import pack
from test_loaders_formats import SIZE, Packed, all_identities, identities, pack_all

WORLD, BATCH, SEED, DEADLINE_S = 2, 4, 3, 120
Epoch = List[List[str]]  # batches of sample identities


def open_case(path: str, options: dict):
    return ArrayDataset(random_images(33, 16, 16)) if path == "array" else open_dataset(path, **options)


def read_epoch(loader) -> Epoch:
    return [identities(images) for images, _ in loader]


def rank_main(rank: int, port: int, cases: Packed, out: Path) -> None:
    mp.set_start_method("fork", force=True)  # as under torchrun; a spawned rank would spawn its workers too
    before = {name: make_loader(open_case(path, options), BATCH, seed=SEED) for name, (path, options) in cases.items()}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=60))
    try:
        results = {}
        for name, (path, options) in cases.items():
            dataset = open_case(path, options)
            loader = make_loader(dataset, BATCH, seed=SEED)
            results[name] = {
                "epochs": [read_epoch(loader), read_epoch(loader)],
                "same_seed": read_epoch(make_loader(dataset, BATCH, seed=SEED)),
                "drop_last": read_epoch(make_loader(dataset, BATCH, seed=SEED, drop_last=True)),
                "world": loader.pixfeed_plan.world.size,
                "made_before_init": [read_epoch(before[name]), read_epoch(before[name])],
            }
        torch.save(results, out / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cases(tmp_path_factory, request) -> Packed:
    root = tmp_path_factory.mktemp("formats")
    return {"array": ("array", {}), **pack_all(root), **bucket_cases(root, request)}


def bucket_cases(root: Path, request) -> Packed:
    """wds streamed from the S3 test server, and lmdb staged from it (both ranks stage at once: one download)."""
    try:
        server = request.getfixturevalue("s3_server")
    except pytest.skip.Exception:
        return {}  # no S3 server here (CI requires it: PIXFEED_REQUIRE_S3)
    options = {"size": SIZE, "storage_options": server.options, "cache_dir": str(root / "cache")}
    cases = {}
    for fmt in ("wds", "lmdb"):
        url = f"s3://pixfeed/distributed/{fmt}"
        pack(root / "src", url, fmt, workers=1, overwrite=True, storage_options=server.options)
        cases[f"{fmt}-bucket"] = (url, options)
    return cases


@pytest.fixture(scope="module")
def ranks(cases, tmp_path_factory) -> List[Dict[str, dict]]:
    out = tmp_path_factory.mktemp("ranks")
    context = mp.start_processes(rank_main, args=(free_port(), cases, out), nprocs=WORLD, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"distributed ranks did not finish within {DEADLINE_S} s")
    return [torch.load(out / f"rank{rank}.pt") for rank in range(WORLD)]


def flat(epoch: Epoch) -> List[str]:
    return [sample for batch in epoch for sample in batch]


def test_every_format_ran_on_both_ranks(ranks, cases):
    for result in ranks:
        assert set(result) == set(cases) and all(r["world"] == WORLD for r in result.values())


def test_ranks_cover_the_dataset_once_apart_from_padding(ranks, cases):
    """Map-style: DistributedSampler repeats (-N) % world samples.  WebDataset: leaves N % world out."""
    for name, (path, options) in cases.items():
        dataset = open_case(path, options)
        expected = all_identities(dataset)
        count = sum(expected.values())
        padding, left_out = (0, count % WORLD) if isinstance(dataset, IterableDataset) else ((-count) % WORLD, 0)
        for epoch in range(2):
            seen = Counter(sum((flat(result[name]["epochs"][epoch]) for result in ranks), []))
            assert sum((expected - seen).values()) == left_out, f"{name}: samples missing in epoch {epoch}"
            assert sum((seen - expected).values()) == padding, f"{name}: more than the documented padding"


def test_ranks_get_equal_batch_counts(ranks, cases):
    for name in cases:
        for key in ("same_seed", "drop_last"):
            assert len({len(result[name][key]) for result in ranks}) == 1, f"{name} {key}"


def test_drop_last_never_repeats_a_sample(ranks, cases):
    for name in cases:
        seen = Counter(sum((flat(result[name]["drop_last"]) for result in ranks), []))
        assert seen and max(seen.values()) == 1, name


def test_a_loader_made_before_init_process_group_splits_as_one_made_after(ranks, cases):
    for name in cases:
        for result in ranks:
            assert result[name]["made_before_init"] == result[name]["epochs"], name


def test_new_order_each_epoch_same_order_same_seed(ranks, cases):
    for name in cases:
        for result in ranks:
            first, second = result[name]["epochs"]
            assert first != second, f"{name}: epoch 2 repeated epoch 1"
            assert result[name]["same_seed"] == first, f"{name}: same seed, different order"
