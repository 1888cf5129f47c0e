"""Ratios to the ceilings and baseline, the project's targets, and where the time goes.

Each row gets ``ratio_to_ceiling`` (pixel rows: delivered bytes/s over the
memory-copy rate; encoded and folder rows: images/s over the bare decode rate
in as many processes as the loader used), ``x_baseline`` (images/s over the
plain DataLoader's) and ``cpu_ms_per_image`` with the busy share of the main
process and of the workers.  ``judge`` checks the targets; a missed target
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


def annotate(rows: List[dict]) -> None:
    """Add the ratio and CPU fields to every row in place (rows[0] is the baseline)."""
    baseline = rows[0]["read"]["images_per_s"]
    for row in rows:
        read = row["read"]
        images = sum(e["images"] for e in read["epochs"])
        row["ratio_to_ceiling"] = round(_read_ratio(row), 3)
        row["pack_ratio"] = None if (r := _pack_ratio(row)) is None else round(r, 3)
        row["x_baseline"] = round(read["images_per_s"] / baseline, 2)
        row["cpu_ms_per_image"] = round(1000 * read["cpu_s"] / max(images, 1), 3)
        row["main_busy"] = round(read["main_cpu_s"] / read["seconds"], 2)
        row["workers_busy"] = round(read["workers_cpu_s"] / (read["seconds"] * read["workers"]), 2) \
            if read["workers"] else None


def _check(row: dict, what: str, value: Optional[float], need: float, note: str) -> dict:
    met = value is not None and value >= need
    return {"row": row["name"], "target": what, "value": value, "required": need, "met": met,
            "note": None if met else note}


def _read_note(row: dict) -> str:
    read, ceiling = row["read"], row["read"]["ceiling"]
    busy = f"main process busy {row['main_busy']:.0%} of the wall time"
    if read["workers"]:
        busy += f", {read['workers']} workers busy {row['workers_busy']:.0%}"
    if "cpu_ms_per_image" in ceiling:
        extra = row["cpu_ms_per_image"] - ceiling["cpu_ms_per_image"]
        return (f"{busy}; {row['cpu_ms_per_image']:.2f} ms CPU per image against {ceiling['cpu_ms_per_image']:.2f} ms "
                f"for the bare decode: {extra:.2f} ms per image go to reading, checksums, tensors, collate and IPC")
    copy_ms = 1000 * read["mb_per_s"] * 1e6 / max(read["images_per_s"], 1e-9) / ceiling["bytes_per_s"]
    return (f"{busy}; {row['cpu_ms_per_image']:.3f} ms CPU per image against {copy_ms:.3f} ms for copying its "
            "pixels once: the rest is per-batch indexing, checksums, tensor wrapping and the loop itself")


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
            pack_note = f"packing spent {row['pack']['cpu_ms_per_image']:.2f} ms CPU per image (checks, checksums)"
            checks.append(_check(row, "pack >= 50% of file copy", row["pack_ratio"], PACK_ENCODED_VS_COPY, pack_note))
    return checks
