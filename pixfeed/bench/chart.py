"""The benchmark's bar chart (needs matplotlib, the ``plot`` extra; skipped without it).

Bars are images/s per reading row on a log axis, coloured by kind, two per
row: training (random-resized crops, hatched) and evaluation (center crops), with the
run-wide ceilings drawn as lines in the same unit: the bare decode rates, and
the memory-copy rate turned into images/s of the benchmark's image size.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from ..image.decode import parse_size

log = logging.getLogger(__name__)
COLOURS = {"files": "#999999", "encoded": "#4c72b0", "pixels": "#dd8452"}


def draw(result: dict, path: Path) -> Optional[Path]:
    """Write the chart to ``path``; return it, or None when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed (pip install 'pixfeed[plot]'): no chart")
        return None
    rows = sorted(result["rows"], key=lambda r: r.get("train", r["read"])["images_per_s"])
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(rows) + 1.8))
    colours = [COLOURS.get(r["store"], "#55a868") for r in rows]
    for offset, key, label, hatch in ((0.2, "train", "training crops", "//"), (-0.2, "read", "center crops", None)):
        drawn = [(y, r) for y, r in enumerate(rows) if key in r]
        rates = [r[key]["images_per_s"] for _, r in drawn]
        ax.barh([y + offset for y, _ in drawn], rates, height=0.4, color=[colours[y] for y, _ in drawn], hatch=hatch,
                edgecolor="white")
        for (y, row), rate in zip(drawn, rates):
            x = row["train_x_baseline"] if key == "train" else row["x_baseline"]
            ax.text(rate, y + offset, f" {rate:,.0f}  {label}, {x:.1f}x baseline", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [r["name"] for r in rows])
    _ceiling_lines(ax, result)
    ax.set_xscale("log")
    top = max(max(r["read"]["images_per_s"], r.get("train", r["read"])["images_per_s"]) for r in rows)
    ax.set_xlim(right=max(ax.get_xlim()[1], top * 12))  # room for the labels right of the longest bar
    ax.set_xlabel("images/s delivered (best epoch, log scale)")
    cfg = result["config"]
    ax.set_title(f"pixfeed bench: {cfg['images']} images, batch {cfg['batch_size']}, {cfg['size']} px, "
                 f"{result['machine']['usable_cpus']} CPUs (hatched: training crops)", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _ceiling_lines(ax, result: dict) -> None:
    c = result["ceilings"]
    h, w = parse_size(result["config"]["size"])
    lines = [(c["decode_1"]["images_per_s"], "decode, 1 process", ":"),
             (c["decode_1_fast"]["images_per_s"], "fast decode, 1 process", (0, (1, 4))),
             (c["decode_pack"]["images_per_s"], f"decode, {c['decode_pack']['processes']} processes", "-."),
             (c["memcopy"]["bytes_per_s"] / (h * w * 3), "memory copy", "--")]
    for x, label, style in lines:
        ax.axvline(x, color="black", linestyle=style, linewidth=1, label=f"{label}: {x:,.0f} img/s")
