"""Ratios to the ceilings and baseline, the project's targets, and where the time goes.

Each row gets ``ratio_to_ceiling`` (pixel rows: delivered bytes/s over the
memory-copy rate; encoded and folder rows: images/s over the bare decode rate
in as many processes as the loader used), ``x_baseline`` (images/s over the
plain DataLoader's, center crops; ``train_x_baseline``: random-resized crops
against the same DataLoader doing them), ``cpu_ms_per_image`` with the busy share of the main
process and of the workers, and ``cpu_efficiency``: the ceiling's own CPU per
image (bare decode, or one copy of the pixels) over the row's, a ratio that
other load on the machine barely moves.  ``judge`` checks the targets; a missed target
carries a note built from those measured figures: which process was busy,
and how much CPU per image went beyond the ceiling's own work.
"""
from __future__ import annotations

from typing import List, Optional

PIXELS_VS_MEMCOPY = 0.5
PIXELS_VS_BASELINE = 5.0
ENCODED_VS_DECODE = 0.9
PACK_ENCODED_VS_COPY = 0.5
PACK_PIXELS_VS_DECODE = 0.8


def _read_ratio(row: dict) -> float:
    read, ceiling = row["read"], row["read"]["ceiling"]
    if row["store"] == "pixels":
        return read["mb_per_s"] * 1e6 / ceiling["bytes_per_s"]
    return read["images_per_s"] / ceiling["images_per_s"]


def _pack_ratio(row: dict) -> Optional[float]:
    pack = row["pack"]
    if pack is None:
        return None
    if row["store"] == "pixels":
        return pack["images_per_s"] / pack["ceiling"]["images_per_s"]
    return pack["mb_per_s"] * 1e6 / pack["ceiling"]["bytes_per_s"]


def _ceiling_ms_per_image(row: dict) -> float:
    """CPU the ceiling spends per image: the bare decode's, or one copy of the image's pixels."""
    read, ceiling = row["read"], row["read"]["ceiling"]
    if "cpu_ms_per_image" in ceiling:
        return ceiling["cpu_ms_per_image"]
    per_image = read["mb_per_s"] * 1e6 / max(read["images_per_s"], 1e-9)
    return 1000 * per_image / ceiling["bytes_per_s"]


def annotate(rows: List[dict]) -> None:
    """Add the ratio and CPU fields to every row in place (rows[0] is the baseline)."""
    baseline = rows[0]["read"]["images_per_s"]
    train_baseline = rows[0].get("train", {}).get("images_per_s")
    for row in rows:
        read = row["read"]
        if train_baseline and "train" in row:
            row["train_x_baseline"] = round(row["train"]["images_per_s"] / train_baseline, 2)
        images = sum(e["images"] for e in read["epochs"])
        row["ratio_to_ceiling"] = round(_read_ratio(row), 3)
        row["pack_ratio"] = None if (r := _pack_ratio(row)) is None else round(r, 3)
        row["x_baseline"] = round(read["images_per_s"] / baseline, 2)
        row["cpu_ms_per_image"] = round(1000 * read["cpu_s"] / max(images, 1), 3)
        row["cpu_efficiency"] = round(_ceiling_ms_per_image(row) / max(row["cpu_ms_per_image"], 1e-9), 3)
        row["main_busy"] = round(read["main_cpu_s"] / read["seconds"], 2)
        row["workers_busy"] = round(read["workers_cpu_s"] / (read["seconds"] * read["workers"]), 2) \
            if read["workers"] else None


def _check(row: dict, what: str, value: Optional[float], need: float, note: str) -> dict:
    met = value is not None and value >= need
    return {"row": row["name"], "target": what, "value": value, "required": need, "met": met,
            "note": None if met else note}


def _read_note(row: dict) -> str:
    read = row["read"]
    busy = f"main process busy {row['main_busy']:.0%} of the wall time"
    if read["workers"]:
        busy += f", {read['workers']} workers busy {row['workers_busy']:.0%}"
    ceiling_ms = _ceiling_ms_per_image(row)
    work = "the bare decode" if "cpu_ms_per_image" in read["ceiling"] else "copying its pixels once"
    return (f"{busy}; {row['cpu_ms_per_image']:.3f} ms CPU per image against {ceiling_ms:.3f} ms for {work} "
            f"(CPU efficiency {row['cpu_efficiency']:.0%}): the other {row['cpu_ms_per_image'] - ceiling_ms:.3f} ms "
            "go to reading, checksums, tensors, collate, IPC and the loop" + _waiting(row))


def _waiting(row: dict) -> str:
    busiest = max(row["main_busy"], row["workers_busy"] or 0.0)
    return "" if busiest >= 0.8 else (f"; no process was busy more than {busiest:.0%} of the time: the rest is "
                                      "waiting (start-up, hand-offs, or CPUs taken by other load)")


def judge(result: dict) -> List[dict]:
    rows = result["rows"]
    annotate(rows)
    checks = []
    for row in rows[2:]:
        if row["store"] == "pixels":
            checks.append(_check(row, "read >= 50% of memcopy", row["ratio_to_ceiling"], PIXELS_VS_MEMCOPY,
                                 _read_note(row)))
            checks.append(_check(row, "read >= 5x baseline", row["x_baseline"], PIXELS_VS_BASELINE, _read_note(row)))
            pack_note = (f"packing spent {row['pack']['cpu_ms_per_image']:.2f} ms CPU per image against "
                         f"{row['pack']['ceiling']['cpu_ms_per_image']:.2f} ms for the bare decode")
            checks.append(_check(row, "pack >= 80% of decode", row["pack_ratio"], PACK_PIXELS_VS_DECODE, pack_note))
        else:
            checks.append(_check(row, "read >= 90% of decode", row["ratio_to_ceiling"], ENCODED_VS_DECODE,
                                 _read_note(row)))
            if not row.get("max_side"):  # re-encoding is a decode and an encode, not a copy
                pack_note = f"packing spent {row['pack']['cpu_ms_per_image']:.2f} ms CPU per image (checks, checksums)"
                checks.append(_check(row, "pack >= 50% of file copy", row["pack_ratio"], PACK_ENCODED_VS_COPY,
                                     pack_note))
    return checks
