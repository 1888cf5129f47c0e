"""The answer ``pixfeed bench`` leads with: which format and settings for this data on this machine, at what cost.

Derived from the measured rows only:

1. the candidates are the packed rows whose bytes on disk (measured: the
   benchmark packs the whole source) fit the disk budget: ``--disk-budget``,
   else the free space under the results folder;
2. the fastest reading candidate wins; among candidates of the same kind
   (store, ``--max-side``) within ``NOISE`` of it, the first in ``--formats``
   order (mmap by default), since figures that close swap places between runs
   (stored-pixel rows, a memory copy of a few milliseconds an epoch, have
   swung 2x between runs on a shared machine; encoded rows about 15%);
3. alongside: its pack command, read rate against the folder baseline, the
   loader settings ``make_loader`` chose in the run, its bytes, and for stored
   pixels the bytes at ``CROP_SIZE`` for random-resized crops; then the
   smallest candidate when it takes under half the disk, and the fastest row
   that did not fit.

With no candidate it says which row came closest and by how much it missed.
"""
from __future__ import annotations

from typing import List, Optional

from ..image.decode import parse_size
from ..console.words import human_bytes, plural

NOISE = {"pixels": 0.5, "encoded": 0.15}  # run-to-run swings of a row's images/s on a shared machine
CROP_SIZE = 256  # the usual stored size for 224-pixel random-resized crops


def _bytes(row: dict, source_bytes: int) -> int:
    return row["pack"].get("bytes") or round(row["pack"]["size_ratio"] * source_bytes)


def choose(rows: List[dict], formats: List[str], source_bytes: int, budget: int) -> Optional[dict]:
    """The recommended row (see the module docstring), or None when no packed row fits ``budget``."""
    fits = [r for r in rows if r["pack"] is not None and _bytes(r, source_bytes) <= budget]
    if not fits:
        return None
    best = max(fits, key=lambda r: r["read"]["images_per_s"])
    close = [r for r in fits if (r["store"], r.get("max_side")) == (best["store"], best.get("max_side"))
             and r["read"]["images_per_s"] >= (1 - NOISE.get(r["store"], 0)) * best["read"]["images_per_s"]]
    order = {f: i for i, f in enumerate(formats)}
    return min(close, key=lambda r: order.get(r["format"], len(order)))


def command(row: dict, size: str) -> str:
    if row["store"] == "pixels":
        return f"pixfeed pack --format {row['format']} --store pixels --size {size} SRC DST"
    side = f" --max-side {row['max_side']}" if row.get("max_side") else ""
    return f"pixfeed pack --format {row['format']} --store encoded{side} SRC DST"


def _these(images: int) -> str:
    return "this one image" if images == 1 else f"these {plural(images, 'image')}"


def _times(x: float) -> str:
    return f"{x:.1f}x" if x < 10 else f"{x:,.0f}x"


def _loader(row: dict) -> str:
    plan = row["read"].get("plan") or {}
    workers = int(plan.get("num_workers", row["read"]["workers"]))
    how = "in the training process" if not workers else f"with {plural(workers, 'worker process', 'worker processes')}"
    batch = ", one gathered read per batch" if plan.get("path") == "batch" else ""
    return f"make_loader reads it {how}{batch} (num_workers={workers})"


def recommend(result: dict) -> dict:
    """{"row", "command", "lines", ...} for ``result``; lines are Markdown bullets."""
    cfg, rows = result["config"], result["rows"]
    source, budget = cfg["source_bytes"], cfg["disk_budget"]
    row = choose(rows, list(cfg["formats"]), source, budget)
    packed = [r for r in rows if r["pack"] is not None]
    if row is None:
        if not packed:
            return {"row": None, "lines": ["no format was packed and read: see 'Not measured' below"]}
        small = min(packed, key=lambda r: _bytes(r, source))
        return {"row": None, "lines": [f"nothing measured fits the disk budget of {human_bytes(budget)} "
                                       f"({cfg['disk_budget_from']}): the smallest, {small['name']}, takes "
                                       f"{human_bytes(_bytes(small, source))}; give it more disk or raise --disk-budget"]}
    return {"row": row["name"], "command": command(row, str(cfg["size"])), "bytes": _bytes(row, source),
            "images_per_s": row["read"]["images_per_s"], "x_baseline": row["x_baseline"],
            "lines": _lines(row, packed, cfg, rows[0])}


def _lines(row: dict, packed: List[dict], cfg: dict, baseline: dict) -> List[str]:
    source, budget, images = cfg["source_bytes"], cfg["disk_budget"], cfg["images"]
    nbytes = _bytes(row, source)
    h, w = parse_size(cfg["size"])
    what = (f"stored pixels at {h}x{w}" if row["store"] == "pixels" else
            f"encoded images, re-encoded to at most {row['max_side']} pixels" if row.get("max_side") else
            "the original encoded images")
    lines = [f"**{row['format']} with {what}**: `{command(row, str(cfg['size']))}`",
             f"- reads {row['read']['images_per_s']:,.0f} images/s here, {_times(row['x_baseline'])} a plain folder "
             f"DataLoader ({baseline['read']['images_per_s']:,.0f} images/s); {_loader(row)}",
             f"- costs {human_bytes(nbytes)} on disk for {_these(images)} ({human_bytes(nbytes / images)} an "
             f"image, {nbytes / source:.2f}x the source) and {row['pack']['seconds']:.1f} s to pack; the disk "
             f"budget is {human_bytes(budget)} ({cfg['disk_budget_from']})"]
    if row["store"] == "pixels" and (h, w) < (CROP_SIZE, CROP_SIZE):
        lines.append(f"- the resolution is fixed at pack time: for random-resized crops pack at --size {CROP_SIZE} "
                     f"(about {human_bytes(nbytes * CROP_SIZE ** 2 / (h * w))})")
    rivals = [r for r in packed if (r["store"], r.get("max_side")) == (row["store"], row.get("max_side"))
              and _bytes(r, source) <= budget]
    rival = max(rivals, key=lambda r: r["read"]["images_per_s"])
    if rival is not row:
        lines.append(f"- {rival['name']} read {rival['read']['images_per_s']:,.0f} images/s in this run, within the "
                     f"run-to-run swing of such rows; {row['format']} comes first in --formats")
    smaller = [r for r in packed if _bytes(r, source) <= nbytes / 2]
    if smaller:
        alt = max(smaller, key=lambda r: r["read"]["images_per_s"])
        lines.append(f"- with less disk: {alt['name']}, {human_bytes(_bytes(alt, source))}, "
                     f"{alt['read']['images_per_s']:,.0f} images/s (`{command(alt, str(cfg['size']))}`)")
    over = [r for r in packed if _bytes(r, source) > budget and r["read"]["images_per_s"] > row["read"]["images_per_s"]]
    if over:
        alt = max(over, key=lambda r: r["read"]["images_per_s"])
        lines.append(f"- {alt['name']} read faster ({alt['read']['images_per_s']:,.0f} images/s) but needs "
                     f"{human_bytes(_bytes(alt, source))}, over the budget")
    return lines
