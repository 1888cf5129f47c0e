"""The answer ``pixfeed bench`` leads with: which format and settings for this data on this machine, at what cost,
for training and for evaluation.

Derived from the measured rows only, once per use: training reads
random-resized crops (``crop="random"``, each row's ``train``), evaluation
reads center crops (``crop="center"``, each row's ``read``):

1. the candidates are the packed rows whose bytes on disk (measured: the
   benchmark packs the whole source) fit the disk budget: ``--disk-budget``,
   else the free space under the results folder; stored pixels are packed at
   the size random-resized crops need (``pack_size``, 256 for 224), so every
   candidate serves both uses;
2. the fastest reading candidate wins; among candidates of the same kind
   (store, ``--max-side``) within ``NOISE`` of it, the first in ``--formats``
   order (mmap by default), since figures that close swap places between runs
   (center crops of stored pixels, a memory copy of a few milliseconds an
   epoch, have swung 2x between runs on a shared machine; rows with per-image
   work, decodes or random-resized crops, about 15%);
3. alongside, for training: its pack command, read rate against the folder
   baseline doing the same crops, the loader settings ``make_loader`` chose in
   the run, its bytes; then the smallest candidate when it takes under half
   the disk, and the fastest row that did not fit.  For evaluation: the same
   row's center-crop rate when it also wins there, else its own pick; for
   stored pixels, what a pack at the delivered size (evaluation only: a
   random-resized crop needs the margin) would take.

With no candidate it says which row came closest and by how much it missed.
"""
from __future__ import annotations

from typing import List, Optional

from ..image.decode import parse_size
from ..console.words import human_bytes, plural

NOISE = {"copy": 0.5, "work": 0.15}  # run-to-run swings of a row's images/s on a shared machine: a plain copy, or not
USES = {"train": "training (random-resized crops)", "read": "evaluation (center crops)"}  # a row's key: the use


def _bytes(row: dict, source_bytes: int) -> int:
    return row["pack"].get("bytes") or round(row["pack"]["size_ratio"] * source_bytes)


def _rate(row: dict, use: str) -> float:
    return row[use]["images_per_s"]


def choose(rows: List[dict], formats: List[str], source_bytes: int, budget: int, use: str = "train") -> Optional[dict]:
    """The recommended row for ``use`` ("train" or "read": see the module docstring), or None when no packed row
    fits ``budget``."""
    fits = [r for r in rows if r["pack"] is not None and _bytes(r, source_bytes) <= budget]
    if not fits:
        return None
    best = max(fits, key=lambda r: _rate(r, use))
    noise = NOISE["copy" if use == "read" and best["store"] == "pixels" else "work"]
    close = [r for r in fits if (r["store"], r.get("max_side")) == (best["store"], best.get("max_side"))
             and _rate(r, use) >= (1 - noise) * _rate(best, use)]
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


def _loader(row: dict, use: str) -> str:
    plan = row[use].get("plan") or {}
    workers = int(plan.get("num_workers", row[use]["workers"]))
    how = "in the training process" if not workers else f"with {plural(workers, 'worker process', 'worker processes')}"
    batch = ", one gathered read per batch" if plan.get("path") == "batch" else ""
    return f"make_loader reads it {how}{batch} (num_workers={workers})"


def recommend(result: dict) -> dict:
    """{"row", "command", "lines", "eval", ...} for ``result``: the top level for training, "eval" for
    evaluation; lines are Markdown bullets."""
    cfg, rows = result["config"], result["rows"]
    source, budget = cfg["source_bytes"], cfg["disk_budget"]
    row = choose(rows, list(cfg["formats"]), source, budget, "train")
    packed = [r for r in rows if r["pack"] is not None]
    if row is None:
        if not packed:
            return {"row": None, "lines": ["no format was packed and read: see 'Not measured' below"]}
        small = min(packed, key=lambda r: _bytes(r, source))
        return {"row": None, "lines": [f"nothing measured fits the disk budget of {human_bytes(budget)} "
                                       f"({cfg['disk_budget_from']}): the smallest, {small['name']}, takes "
                                       f"{human_bytes(_bytes(small, source))}; give it more disk or raise --disk-budget"]}
    evaluation = choose(rows, list(cfg["formats"]), source, budget, "read")
    pack_size = str(cfg.get("pack_size", cfg["size"]))
    return {"row": row["name"], "command": command(row, pack_size), "bytes": _bytes(row, source),
            "images_per_s": _rate(row, "train"), "x_baseline": row["train_x_baseline"],
            "eval": {"row": evaluation["name"], "command": command(evaluation, pack_size),
                     "images_per_s": _rate(evaluation, "read"), "x_baseline": evaluation["x_baseline"]},
            "lines": _lines(row, packed, cfg, rows[0]) + _eval_lines(evaluation, row, cfg, rows[0])}


def _what(row: dict, pack_size: str) -> str:
    h, w = parse_size(pack_size)
    return (f"stored pixels at {h}x{w}" if row["store"] == "pixels" else
            f"encoded images, re-encoded to at most {row['max_side']} pixels" if row.get("max_side") else
            "the original encoded images")


def _versus(row: dict, use: str, baseline: dict) -> str:
    x = row["train_x_baseline"] if use == "train" else row["x_baseline"]
    how = "doing the same random-resized crops" if use == "train" else "doing Resize + CenterCrop"
    return (f"reads {_rate(row, use):,.0f} images/s here, {_times(x)} a plain folder DataLoader {how} "
            f"({_rate(baseline, use):,.0f} images/s); {_loader(row, use)}")


def _lines(row: dict, packed: List[dict], cfg: dict, baseline: dict) -> List[str]:
    source, budget, images = cfg["source_bytes"], cfg["disk_budget"], cfg["images"]
    nbytes, pack_size = _bytes(row, source), str(cfg.get("pack_size", cfg["size"]))
    lines = [f"**For {USES['train']}: {row['format']} with {_what(row, pack_size)}**: `{command(row, pack_size)}`, "
             f"read with `crop=\"random\"`",
             f"- {_versus(row, 'train', baseline)}",
             f"- costs {human_bytes(nbytes)} on disk for {_these(images)} ({human_bytes(nbytes / images)} an "
             f"image, {nbytes / source:.2f}x the source) and {row['pack']['seconds']:.1f} s to pack; the disk "
             f"budget is {human_bytes(budget)} ({cfg['disk_budget_from']})"]
    rivals = [r for r in packed if (r["store"], r.get("max_side")) == (row["store"], row.get("max_side"))
              and _bytes(r, source) <= budget]
    rival = max(rivals, key=lambda r: _rate(r, "train"))
    if rival is not row:
        lines.append(f"- {rival['name']} read {_rate(rival, 'train'):,.0f} images/s in this run, within the "
                     f"run-to-run swing of such rows; {row['format']} comes first in --formats")
    smaller = [r for r in packed if _bytes(r, source) <= nbytes / 2]
    if smaller:
        alt = max(smaller, key=lambda r: _rate(r, "train"))
        lines.append(f"- with less disk: {alt['name']}, {human_bytes(_bytes(alt, source))}, "
                     f"{_rate(alt, 'train'):,.0f} images/s (`{command(alt, pack_size)}`)")
    over = [r for r in packed if _bytes(r, source) > budget and _rate(r, "train") > _rate(row, "train")]
    if over:
        alt = max(over, key=lambda r: _rate(r, "train"))
        lines.append(f"- {alt['name']} read faster ({_rate(alt, 'train'):,.0f} images/s) but needs "
                     f"{human_bytes(_bytes(alt, source))}, over the budget")
    return lines


def _eval_lines(row: dict, train: dict, cfg: dict, baseline: dict) -> List[str]:
    pack_size, (h, w) = str(cfg.get("pack_size", cfg["size"])), parse_size(cfg["size"])
    if row is train:
        lines = [f"**For {USES['read']}: the same pack**, read with `crop=\"center\"`", f"- {_versus(row, 'read', baseline)}"]
    else:
        lines = [f"**For {USES['read']}: {row['format']} with {_what(row, pack_size)}**: `{command(row, pack_size)}`, "
                 f"read with `crop=\"center\"`", f"- {_versus(row, 'read', baseline)}"]
    ph, pw = parse_size(pack_size)
    if row["store"] == "pixels" and (ph, pw) != (h, w):
        smaller = _bytes(row, cfg["source_bytes"]) * h * w / (ph * pw)
        lines.append(f"- a pack for evaluation only can store `--size {cfg['size']}` (about {human_bytes(smaller)}): "
                     "its center crop is then a plain copy; it cannot serve random-resized crops, which need the "
                     f"margin of {ph}x{pw}")
    return lines
