"""The bench's recommendation, from measured rows: the fastest pack that fits the disk budget."""
from __future__ import annotations

from pixfeed.bench.recommend import choose, recommend

MB = 10**6


def row(fmt, store, rate, nbytes, max_side=None, workers=0):
    name = f"{fmt}/{store}" + (f" max-side {max_side}" if max_side else "")
    return {"name": name, "format": fmt, "store": store, "max_side": max_side, "x_baseline": rate / 100,
            "pack": {"bytes": nbytes, "size_ratio": nbytes / (100 * MB), "seconds": 1.0},
            "read": {"images_per_s": rate, "workers": workers,
                     "plan": {"path": "batch", "num_workers": str(workers), "read_ahead": "False"}}}


BASELINE = {"name": "folder (DataLoader, 4 workers)", "format": "folder", "store": "files", "pack": None,
            "x_baseline": 1.0, "read": {"images_per_s": 100, "workers": 4}}
ROWS = [BASELINE, row("mmap", "encoded", 300, 100 * MB, workers=2), row("lmdb", "encoded", 320, 101 * MB, workers=2),
        row("hdf5", "pixels", 30000, 140 * MB), row("mmap", "pixels", 27000, 140 * MB),
        row("wds", "pixels", 3000, 141 * MB), row("mmap", "encoded", 600, 30 * MB, max_side=384, workers=2)]
FORMATS = ["mmap", "lmdb", "hdf5", "wds"]


def result(budget):
    return {"config": {"formats": FORMATS, "size": "224", "source_bytes": 100 * MB, "images": 1000,
                       "disk_budget": budget, "disk_budget_from": "--disk-budget"}, "rows": ROWS}


def test_stored_pixels_when_the_budget_allows_first_format_within_noise():
    chosen = choose(ROWS, FORMATS, 100 * MB, 200 * MB)
    assert chosen["name"] == "mmap/pixels"  # hdf5 read 11% faster: within noise, mmap comes first
    rec = recommend(result(200 * MB))
    assert rec["command"] == "pixfeed pack --format mmap --store pixels --size 224 SRC DST"
    text = "\n".join(rec["lines"])
    assert "140.0 MB on disk for these 1,000 images" in text and "in the training process" in text
    assert "hdf5/pixels read 30,000 images/s in this run, within the run-to-run swing" in text
    assert "--size 256" in text and "with less disk: mmap/encoded max-side 384, 30.0 MB" in text


def test_encoded_with_max_side_when_pixels_do_not_fit():
    rec = recommend(result(120 * MB))
    assert rec["row"] == "mmap/encoded max-side 384" and "--max-side 384" in rec["command"]
    text = "\n".join(rec["lines"])
    assert "2 worker processes" in text and "over the budget" in text and "hdf5/pixels" in text


def test_a_clearly_faster_row_wins_over_format_order():
    rows = [BASELINE, row("mmap", "encoded", 300, 100 * MB), row("lmdb", "encoded", 400, 100 * MB)]
    assert choose(rows, FORMATS, 100 * MB, 200 * MB)["name"] == "lmdb/encoded"
    rows = [BASELINE, row("mmap", "pixels", 10000, 140 * MB), row("lmdb", "pixels", 21000, 140 * MB)]
    assert choose(rows, FORMATS, 100 * MB, 200 * MB)["name"] == "lmdb/pixels"


def test_nothing_fits_says_so():
    rec = recommend(result(10 * MB))
    assert rec["row"] is None and "mmap/encoded max-side 384, takes 30.0 MB" in rec["lines"][0]
