"""The benchmark's output: a Markdown report (also the terminal table), results.json, the chart.

The report leads with the recommendation (``recommend.py``); the project's own
targets (``targets.py``) are always in results.json, and in the report only
with ``pixfeed bench --targets``.

Reading rows are sorted by images/s (the best epoch), in two tables: for
training (random-resized crops, ``crop="random"``) and for evaluation (center
crops); each row shows its ratio to the plain-DataLoader baseline doing the same
crops, the evaluation rows also to the ceiling measured just before it.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from ..manifest import write_json_atomic
from ..console.texttable import table
from ..console.words import human_bytes, plural
from .machine import summary

READ_HEAD = ("format/store", "images/s", "MB/s", "vs ceiling", "ceiling", "x baseline",
             "dataset read directly (no loader), img/s", "loader vs direct", "1st batch s",
             "peak RSS main/workers MB", "CPU s", "CPU vs ceiling", "workers")
TRAIN_HEAD = ("format/store", "images/s", "MB/s", "x baseline", "1st batch s", "peak RSS main/workers MB", "CPU s",
              "workers")
PACK_HEAD = ("format/store", "pack s", "images/s", "MB/s", "vs ceiling", "ceiling", "on disk vs source")


def _ceiling(c: dict) -> str:
    if "images_per_s" in c and "processes" in c:
        return f"{c['name']}: {c['images_per_s']:.0f} img/s"
    return f"{c['name']}: {c['bytes_per_s'] / 1e6:,.0f} MB/s"


def _read_cells(row: dict) -> List[str]:
    r, direct = row["read"], (row.get("direct") or {}).get("images_per_s")
    return [row["name"], f"{r['images_per_s']:,.0f}", f"{r['mb_per_s']:,.0f}", f"{row['ratio_to_ceiling']:.0%}",
            _ceiling(r["ceiling"]), f"{row['x_baseline']:.1f}x", f"{direct:,.0f}" if direct else "-",
            f"{r['images_per_s'] / direct:.0%}" if direct else "-", f"{r['first_batch_s']:.2f}",
            f"{r['main_peak_mb']:,.0f} / {r['workers_peak_mb']:,.0f}", f"{r['cpu_s']:.1f}", f"{row['cpu_efficiency']:.0%}",
            str(r["workers"])]


def _train_cells(row: dict) -> List[str]:
    r = row["train"]
    return [row["name"], f"{r['images_per_s']:,.0f}", f"{r['mb_per_s']:,.0f}", f"{row['train_x_baseline']:.1f}x",
            f"{r['first_batch_s']:.2f}", f"{r['main_peak_mb']:,.0f} / {r['workers_peak_mb']:,.0f}", f"{r['cpu_s']:.1f}",
            str(r["workers"])]


def _pack_cells(row: dict) -> List[str]:
    p = row["pack"]
    return [row["name"], f"{p['seconds']:.1f}", f"{p['images_per_s']:,.0f}", f"{p['mb_per_s']:,.0f}",
            f"{row['pack_ratio']:.0%}", _ceiling(p["ceiling"]), f"{p['size_ratio']:.2f}x"]


def markdown(result: dict, targets: bool = False) -> str:
    """The report: the recommendation first, then the measured tables; the project's targets with ``targets``."""
    cfg, rows = result["config"], result["rows"]
    c = result["ceilings"]
    lines = [f"# pixfeed bench: {plural(cfg['images'], 'image')}, {human_bytes(cfg['source_bytes'])} from {cfg['src']}",
             "", "## Recommendation for this data on this machine", "", *result["recommendation"]["lines"], "",
             f"Machine: {summary(result['machine'])}.", "",
             f"Batch {cfg['batch_size']}, {cfg['size']} px delivered (stored pixels packed at "
             f"{cfg.get('pack_size', cfg['size'])} px), {cfg['epochs']} epochs, "
             f"{'cold' if cfg['cold'] else 'warm'} cache. Run-wide ceilings: {_ceiling(c['memcopy'])}, "
             f"{_ceiling(c['file_copy'])}, {_ceiling(c['decode_1'])}, {_ceiling(c['decode_1_fast'])}, "
             f"{_ceiling(c['decode_pack'])}.", "",
             "## Reading for training: random-resized crops and flips (crop=\"random\"; best epoch)", ""]
    trained = sorted((r for r in rows if "train" in r), key=lambda r: -r["train"]["images_per_s"])
    lines += table(TRAIN_HEAD, [_train_cells(r) for r in trained])
    lines += ["", "## Reading for evaluation: center crops (crop=\"center\"; best epoch; each ceiling measured just "
              "before and after its row, higher kept)", ""]
    ordered = sorted(rows, key=lambda r: -r["read"]["images_per_s"])
    lines += table(READ_HEAD, [_read_cells(r) for r in ordered])
    packed = [r for r in rows if r["pack"] is not None]
    if packed:
        lines += ["", "## Packing", "", *table(PACK_HEAD, [_pack_cells(r) for r in packed])]
    if targets:
        lines += ["", "## Targets (the project's engineering goals, not your machine's)", ""]
        lines += [_target_line(t) for t in result["targets"]]
    lines += _storage_lines(packed)
    if result["unavailable"]:
        lines += ["", "## Not measured", ""] + [f"- {k}: {v}" for k, v in result["unavailable"].items()]
    return "\n".join(lines) + "\n"


def _target_line(t: dict) -> str:
    value = "n/a" if t["value"] is None else f"{t['value']:.2f}"
    mark = "met" if t["met"] else "MISSED"
    return f"- {mark}: {t['row']} {t['target']} ({value}, need {t['required']})" + \
        ("" if t["met"] else f": {t['note']}")


def _storage_lines(rows: List[dict]) -> List[str]:
    lines = []
    for r in rows:
        s = r["storage"]
        cold = "" if s["cold_mb_per_s"] is None else f", cold {s['cold_mb_per_s']:,.0f} MB/s"
        frac = s["cold_resident_fraction"]
        if frac is None and s["cold_mb_per_s"] is not None:
            cold += " (could not check that eviction worked)"
        elif frac is not None and frac > 0.1:
            cold += f" (eviction did NOT work: {frac:.0%} still cached, so this is not a cold read)"
        lines.append(f"- {r['name']}: {s['bytes'] / 1e6:,.0f} MB, warm {s['warm_mb_per_s']:,.0f} MB/s{cold}")
    return ["", "## Storage read rate of the packed files", "", *lines] if lines else []


def write(result: dict, out: Path, targets: bool = False) -> List[Path]:
    """Write results.json (targets always), results.md (targets when asked) and, with matplotlib,
    results.png into ``out``."""
    from .chart import draw

    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "results.json", result)
    (out / "results.md").write_text(markdown(result, targets), encoding="utf-8")
    written = [out / "results.json", out / "results.md"]
    chart: Optional[Path] = draw(result, out / "results.png")
    return written + ([chart] if chart else [])
