"""benchmarks/gpu_feed.py runs: its --cpu-smoke mode on a few generated JPEGs writes every row with its
numbers, records why the GPU rows were skipped, and the GPU row's loader call works with device='cpu'.
Figures are not judged here (speed is measured by the benchmark, on a GPU); only that they are there."""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import write_image

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_feed.py"
FEEDS = ("pixfeed cpu", "pixfeed gpu")
KINDS = ("full", "max-side", "pixels")


def bench_module():
    spec = importlib.util.spec_from_file_location("gpu_feed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_feed")
    for c in range(2):
        for i in range(4):
            write_image(root / "img" / f"class{c}" / f"photo{i}.jpg", size=(120 + 9 * i, 90 + 6 * c),
                        seed=10 * c + i, fmt="JPEG")
    out, work = root / "out" / "results.json", root / "work"
    run = subprocess.run([sys.executable, str(SCRIPT), "--images", str(root / "img"), "--cpu-smoke", "--copies", "3",
                          "--out", str(out), "--workdir", str(work)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(out.read_text()), run.stdout, work


def rows(results, feed):
    return {r["data"]: r for r in results["rows"] if r["feed"] == feed}


def test_smoke_writes_every_row_with_numbers(smoke):
    results, stdout, _ = smoke
    assert results["finished"] and results["mode"] == "cpu-smoke" and results["dataset"]["images"] == 24
    assert set(results["packs"]) == set(KINDS)
    model = results["rows"][0]["model"]
    assert results["rows"][0]["feed"] == "appetite" and results["rows"][0]["status"] == "ok"
    measured = [rows(results, "pixfeed cpu")[k] for k in KINDS] + [rows(results, "folder baseline")["folder"]]
    for row in [results["rows"][0], *measured]:
        assert row["status"] == "ok" and row["model"] == model, row
        assert row["images_per_s"] > 0 and row["images"] == row["batches"] * 4 and 1 <= row["batches"] <= 3
        assert math.isfinite(row["cores_busy"]) and row["cores_busy"] > 0
    for row in measured:
        assert row["share"] > 0 and row["loader_cores_est"] >= 0 and row["warmup_batches"] >= 1
    assert "workers" in rows(results, "folder baseline")["folder"]["loader"]
    assert f"{model:<11} pixfeed cpu" in stdout and "of appetite" in stdout


def test_smoke_records_why_gpu_rows_are_skipped(smoke):
    results, _, _ = smoke
    skipped = rows(results, "pixfeed gpu")
    assert set(skipped) == set(KINDS)
    assert all(r["status"] == "skipped" and "--cpu-smoke" in r["reason"] for r in skipped.values())
    assert all(g["share"] is None and g["met"] is None for g in results["goals"])


def test_gpu_rows_loader_call_works_with_a_device(smoke):
    """What a GPU row calls, with device='cpu': make_loader(..., device=) on each pack gives batches of the crop size."""
    results, _, work = smoke
    bench = bench_module()
    args = bench.parse_args(["--images", "unused", "--cpu-smoke"])
    for kind in KINDS:
        loader, how, plan = bench.pixfeed_loader(str(work / kind), args, torch.device("cpu"))
        images, labels = next(iter(loader))[:2]
        assert images.shape == (4, 3, 64, 64) and images.dtype == torch.uint8 and "device='cpu'" in how
        assert bench.plan_of(plan)["device"] == "cpu"


def test_cpu_use_counts_live_child_processes():
    bench = bench_module()
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 60\nwhile time.time() < end: pass"])
    try:
        meter = bench.CpuMeter().start()
        assert str(busy.pid) in meter.kids0
        while bench.cpu_seconds(str(busy.pid)) < meter.kids0[str(busy.pid)] + 0.3:
            time.sleep(0.01)
        used = meter.stop()
        assert used["cores_busy_children"] > 0 and used["cores_busy"] >= used["cores_busy_children"]
    finally:
        busy.kill()
        busy.wait()
