"""``pixfeed bench``: a tiny end-to-end run, and the measuring parts it relies on."""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json

import numpy as np
import pytest
import torch

from pixfeed.storage import pagecache
from pixfeed.bench.cli import _size
from pixfeed.bench.procstats import ProcUsage
from pixfeed.bench.report import markdown
from pixfeed.bench.reading import read_epochs
from pixfeed.bench.runner import BenchConfig, _try_row, row_name
from pixfeed.cli import main
from pixfeed.errors import OptionError
from pixfeed.manifest import STORES
from pixfeed.registry import FORMATS

ROW_FIELDS = {"name", "format", "store", "pack", "storage", "read", "ratio_to_ceiling", "pack_ratio",
              "x_baseline", "cpu_ms_per_image", "cpu_efficiency", "main_busy", "workers_busy"}
READ_FIELDS = {"ceiling", "epochs", "images_per_s", "mb_per_s", "first_batch_s", "workers", "plan", "seconds",
               "main_peak_mb", "workers_peak_mb", "workers_seen", "main_cpu_s", "workers_cpu_s", "cpu_s",
               "peak_reset"}
PACK_FIELDS = {"seconds", "images_per_s", "mb_per_s", "size_ratio", "cpu_ms_per_image", "ceiling"}
STORAGE_FIELDS = {"bytes", "warm_mb_per_s", "cold_mb_per_s", "cold_resident_fraction"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One small run without SRC (so it makes its own sample), cold, 1 epoch, no workers."""
    out = tmp_path_factory.mktemp("bench")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["bench", "--count", "12", "--batch-size", "4", "--epochs", "1", "--workers", "0",
                     "--cold", "--max-side", "24", "--disk-budget", "100M", "--out", str(out), "-q"])
    return code, out, stdout.getvalue()


def test_run_measures_every_format_and_store(run):
    code, out, _ = run
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in result["rows"]}
    expected = {f"{fmt}/{store}" for fmt in FORMATS for store in STORES}
    assert expected <= set(rows), result["unavailable"]
    shrunk = rows.pop("mmap/encoded max-side 24")  # the first format, re-encoded at pack time: smaller
    assert shrunk["pack"]["size_ratio"] < rows["mmap/encoded"]["pack"]["size_ratio"]
    assert shrunk["read"]["ceiling"]["name"].endswith("max-side 24") and shrunk["read"]["images_per_s"] > 0
    assert len(rows) == len(expected) + 2  # and the two baselines
    baseline = result["rows"][0]
    assert baseline["name"].startswith("folder (DataLoader") and baseline["x_baseline"] == 1.0
    for row in rows.values():
        assert ROW_FIELDS <= set(row) and READ_FIELDS <= set(row["read"])
        assert {e["images"] for e in row["read"]["epochs"]} == {12}  # every epoch reads all 12
        # and once more for training: random-resized crops, beside the baseline doing the same crops
        assert READ_FIELDS <= set(row["train"]) and {e["images"] for e in row["train"]["epochs"]} == {12}
        train_speedup = row["train"]["images_per_s"] / baseline["train"]["images_per_s"]
        assert row["train_x_baseline"] == pytest.approx(train_speedup, abs=0.006)
        assert row["read"]["images_per_s"] > 0 and row["ratio_to_ceiling"] > 0
        speedup = row["read"]["images_per_s"] / baseline["read"]["images_per_s"]
        assert row["x_baseline"] == pytest.approx(speedup, abs=0.006)
    for name in expected:  # each format row: the dataset read directly, beside its loader
        assert rows[name]["direct"]["images_per_s"] > 0, name
    assert "dataset read directly (no loader), img/s" in (out / "results.md").read_text()
    source_bytes = result["config"]["source_bytes"]
    for name in expected:
        pack, stored = rows[name]["pack"], rows[name]["storage"]
        assert PACK_FIELDS <= set(pack) and STORAGE_FIELDS <= set(stored)
        assert pack["size_ratio"] == pytest.approx(stored["bytes"] / source_bytes, abs=0.0006)  # the same files
        # pixels: every image decoded to 256x256 RGB (the margin 224-pixel random-resized crops need);
        # encoded: every source byte kept, not re-encoded
        assert stored["bytes"] >= (12 * 256 * 256 * 3 if name.endswith("/pixels") else source_bytes)
        assert stored["cold_mb_per_s"] > 0
        assert stored["cold_resident_fraction"] is None or 0.0 <= stored["cold_resident_fraction"] <= 1.0
    assert {t["row"] for t in result["targets"]} == expected | {"mmap/encoded max-side 24"}
    assert all(t["met"] or t["note"] for t in result["targets"])


def test_output_leads_with_the_recommendation_and_hides_the_targets(run):
    _, out, stdout = run
    headings = [line for line in stdout.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Recommendation for this data on this machine"
    assert "MISSED" not in stdout and "## Targets" not in stdout and "## Targets" not in (out / "results.md").read_text()
    result = json.loads((out / "results.json").read_text())
    rec = result["recommendation"]
    assert rec["command"] in stdout and rec["row"] in {r["name"] for r in result["rows"]}
    assert rec["bytes"] <= result["config"]["disk_budget"] == 100 * 10**6
    assert result["config"]["pack_size"] == "256" and "--size 224" not in rec["command"]
    assert rec["eval"]["command"] in stdout and "**For training (random-resized crops)" in stdout
    assert "## Reading for training: random-resized crops" in stdout
    assert result["targets"] and "## Targets" in markdown(result, targets=True)


def test_disk_budget_units():
    assert (_size("100M"), _size("1.5g"), _size("2048")) == (100 * 10**6, 1500 * 10**6, 2048)
    with pytest.raises(argparse.ArgumentTypeError, match="'12Q'"):
        _size("12Q")


def test_run_writes_markdown_and_chart(run):
    _, out, _ = run
    text = (out / "results.md").read_text()
    for fmt in FORMATS:
        assert f"| {fmt}/pixels" in text and f"| {fmt}/encoded" in text
    if importlib.util.find_spec("matplotlib"):
        assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_format_or_store_is_refused_before_any_work():
    with pytest.raises(OptionError, match=f"'nosuchformat'.*expected some of {', '.join(FORMATS)}"):
        BenchConfig(formats=["mmap", "nosuchformat"])
    with pytest.raises(OptionError, match=r"stores \['raw'\]"):
        BenchConfig(stores=["raw"])


class HalfBrokenBench:
    """``format_row`` works for mmap and fails for every other format."""

    def format_row(self, fmt, store, max_side=None):
        if fmt != "mmap":
            raise RuntimeError(f"{fmt} cannot pack")
        return {"name": row_name(fmt, store, max_side)}


def test_a_failing_format_is_listed_and_the_others_still_run():
    result = {"unavailable": {}, "rows": []}
    for fmt in ("lmdb", "mmap"):
        _try_row(HalfBrokenBench(), fmt, "encoded", result, max_side=24)
    assert result["rows"] == [{"name": "mmap/encoded max-side 24"}]
    assert result["unavailable"] == {"lmdb/encoded max-side 24": "RuntimeError: lmdb cannot pack"}


def test_bad_option_names_the_choices(capsys):
    assert main(["bench", "--formats", "mmap,zip", "-q"]) == 2
    assert f"expected a comma-separated list of {', '.join(FORMATS)}" in capsys.readouterr().err


def test_cold_read_evicts_and_says_how_much_stayed(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(np.random.default_rng(0).bytes(1 << 20))
    warm = pagecache.read_rate([path], cold=False)
    cold = pagecache.read_rate([path], cold=True)
    assert warm["bytes"] == cold["bytes"] == 1 << 20 and warm["resident_before"] is None
    assert cold["resident_before"] is None or 0.0 <= cold["resident_before"] <= 1.0
    assert pagecache.resident_fraction([path]) in (None, 1.0)  # the timed read brought it back


def test_worker_memory_and_cpu_are_counted():
    data = torch.utils.data.TensorDataset(torch.zeros(32, 3, 8, 8, dtype=torch.uint8), torch.arange(32))

    def make():
        return torch.utils.data.DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)

    result = read_epochs(make, 2, lambda workers: {"workers": workers})
    assert result["ceiling"]["workers"] == 1 and len(result["ceiling"]["samples"]) == 2
    counts = [e["images"] for e in result["epochs"]]
    assert len(counts) >= 2 and set(counts) == {32}  # at least --epochs, more while under MIN_READ_S
    assert result["workers_seen"] == 1 and result["workers_peak_mb"] > 0
    assert result["workers_cpu_s"] > 0 and result["main_peak_mb"] > 0


def test_proc_usage_without_children_reports_zero_workers():
    usage = ProcUsage().start()
    usage.sample(force=True)
    stats = usage.stop()
    assert stats["workers_seen"] == 0 and stats["workers_peak_mb"] == 0


def test_zero_epochs_is_refused(capsys):
    assert main(["bench", "--epochs", "0", "-q"]) == 2
    assert "--epochs 0: must be at least 1" in capsys.readouterr().err
