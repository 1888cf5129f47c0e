"""pixfeed loaders inside Lightning and Accelerate, the real frameworks on CPU (gloo).

One launch per framework and world size runs every case (``frameworks/*_run.py``) and saves what each rank
read; the tests check that every epoch is split by rank exactly once (disjoint ranks, union = the dataset:
32 samples, a whole number of batches on 2 ranks, so no padding), and that one process through a framework
reads what ``make_loader`` alone reads."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler, SequentialSampler

pytest.importorskip("accelerate")
pytest.importorskip("lightning")

from conftest import make_tree  # noqa: E402
from frameworks.common import BATCH, COUNT, datasets, identities  # noqa: E402
from pixfeed.loaders import PixfeedLoader, make_loader  # noqa: E402
from pixfeed.packers import pack  # noqa: E402

SCRIPTS = Path(__file__).parent / "frameworks"
DEADLINE_S = 240


@pytest.fixture(scope="module")
def wds(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("frameworks")
    src = make_tree(root / "src", classes=("a", "b"), per_class=COUNT // 2)
    pack(src, root / "wds", "wds", store="pixels", size=6, shard_size=4, workers=1)
    return str(root / "wds")


def run(tmp_path_factory, command, wds, ranks):
    out = tmp_path_factory.mktemp("out")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")]))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, *command, str(out), wds], cwd=SCRIPTS, env=env, capture_output=True,
                          text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [torch.load(out / f"rank{rank}.pt") for rank in range(ranks)]


@pytest.fixture(scope="module")
def accelerate_2(tmp_path_factory, wds):
    return run(tmp_path_factory, ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                  "accelerate_run.py"], wds, 2)


@pytest.fixture(scope="module")
def accelerate_1(tmp_path_factory, wds):
    return run(tmp_path_factory, ["accelerate_run.py"], wds, 1)[0]


@pytest.fixture(scope="module")
def lightning(tmp_path_factory, wds):
    return run(tmp_path_factory, ["lightning_run.py"], wds, 2)


@pytest.fixture(scope="module")
def everything(wds):
    """Every sample's identity, per kind of dataset, read one by one."""
    found = {}
    for kind, dataset in datasets(wds).items():
        samples = dataset if kind == "wds" else (dataset[i] for i in range(len(dataset)))
        found[kind] = Counter(sum((identities([image[None]]) for image, _ in samples), []))
    return found


def check_split_once(name, per_rank, expected):
    """per_rank: each rank's 2 epochs of sample identities."""
    for epoch in range(2):
        seen = [per_rank[rank][epoch] for rank in range(2)]
        assert len(seen[0]) == len(seen[1]) == COUNT // 2, f"{name} epoch {epoch}: {len(seen[0])}, {len(seen[1])}"
        assert Counter(seen[0] + seen[1]) == expected, f"{name} epoch {epoch}: not each sample once"
    assert per_rank[0][0] != per_rank[0][1], f"{name}: epoch 2 repeated epoch 1 (set_epoch lost)"


def test_accelerate_splits_every_epoch_once(accelerate_2, everything):
    cases = sorted(accelerate_2[0])
    assert len(cases) == 16 and cases == sorted(accelerate_2[1])  # 4 configurations x before/after x map/wds
    for case in cases:
        check_split_once(case, [result[case] for result in accelerate_2], everything[case.rsplit("/", 1)[1]])


def test_accelerate_in_one_process_reads_what_make_loader_reads(accelerate_1):
    for case, epochs in accelerate_1.items():
        if case != "alone":
            assert epochs == accelerate_1["alone"][case.rsplit("/", 1)[1]], case


def test_lightning_ddp_splits_every_epoch_once(lightning, everything):
    for when in ("before", "after", "datamodule"):
        cases = lightning[0][when]
        assert set(cases) == ({"datamodule"} if when == "datamodule" else {"map", "wds"})
        for kind in cases:
            check_split_once(f"{when}/{kind}", [result[when][kind] for result in lightning],
                             everything["map" if kind == "datamodule" else kind])


def test_lightning_in_one_process_reads_what_make_loader_reads(lightning):
    assert lightning[0]["single"] == lightning[0]["alone"]


def test_lightning_can_recreate_the_loader_with_its_own_sampler(wds):
    """What Lightning does to inject a sampler (and always when predicting): a new loader from the attributes."""
    from lightning.fabric.utilities.data import _update_dataloader

    loader = make_loader(datasets(wds)["map"], BATCH, num_workers=0)
    recreated = _update_dataloader(loader, SequentialSampler(loader.dataset))
    assert isinstance(recreated, PixfeedLoader) and recreated.pixfeed_plan is loader.pixfeed_plan
    assert [int(x) for _, labels in recreated for x in labels] == list(range(COUNT))


def test_lightning_predict_on_two_devices_predicts_every_sample_once(lightning, everything):
    """trainer.predict(strategy="ddp", devices=2): the README's call (distributed=False: Lightning's own
    unrepeated split wraps pixfeed's sampler) and the defaults (pixfeed splits; Lightning keeps its sampler)."""
    for how in ("defaults", "distributed=False"):
        per_rank = [result["predict"][how] for result in lightning]
        assert len(per_rank[0]) == len(per_rank[1]) == COUNT // 2, f"{how}: {len(per_rank[0])}, {len(per_rank[1])}"
        assert Counter(per_rank[0] + per_rank[1]) == everything["map"], f"{how}: not each sample once"


def test_only_a_splitting_loader_has_a_distributed_sampler(wds, monkeypatch):
    """Frameworks keep a DistributedSampler and wrap any other sampler in their split."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    dataset = datasets(wds)["map"]
    for distributed in ("auto", True):
        assert isinstance(make_loader(dataset, BATCH, num_workers=0, distributed=distributed).sampler,
                          DistributedSampler)
    plain = make_loader(dataset, BATCH, num_workers=0, distributed=False, shuffle=False)
    assert not isinstance(plain.sampler, DistributedSampler)
    assert [int(x) for _, labels in plain for x in labels] == list(range(COUNT))
