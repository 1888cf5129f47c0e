"""The benchmark's bar chart (needs matplotlib, the ``plot`` extra; skipped without it).

Bars are images/s per reading row on a log axis, coloured by kind, with the
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
    rows = sorted(result["rows"], key=lambda r: r["read"]["images_per_s"])
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.8))
    rates = [r["read"]["images_per_s"] for r in rows]
    ax.barh([r["name"] for r in rows], rates, color=[COLOURS.get(r["store"], "#55a868") for r in rows])
    for y, (rate, row) in enumerate(zip(rates, rows)):
        ax.text(rate, y, f" {rate:,.0f}  ({row['ratio_to_ceiling']:.0%} of ceiling)", va="center", fontsize=8)
    _ceiling_lines(ax, result)
    ax.set_xscale("log")
    ax.set_xlabel("images/s delivered (best epoch, log scale)")
    cfg = result["config"]
    ax.set_title(f"pixfeed bench: {cfg['images']} images, batch {cfg['batch_size']}, {cfg['size']} px, "
                 f"{result['machine']['usable_cpus']} CPUs", fontsize=10)
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
