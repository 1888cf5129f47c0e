"""Packing one format x store with its figures, and the read rate of the files it wrote."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, List, Tuple

from ..storage import pagecache
from ..image.decode import Size
from .ceilings import bracket
from .procstats import ProcUsage


def pack_measured(src: Path, dst: Path, fmt: str, store: str, size: Size, workers: int,
                  limit: Callable[[], dict], **options: Any) -> Tuple[dict, dict]:
    """Pack ``src`` to ``dst``; return the manifest and the figures, with ``limit()`` taken before and after.
    ``options`` go to ``pack``."""
    from ..packers import pack

    before = limit()
    usage = ProcUsage().start()
    sized = {"size": size} if store == "pixels" else {}
    m = pack(src, dst, fmt, store=store, workers=workers, overwrite=True, **sized, **options)
    cpu_s = usage.stop()["cpu_s"]
    stats, seconds = m["stats"], max(m["stats"]["seconds"], 1e-9)
    on_disk = sum(f["bytes"] for f in m["files"].values())
    return m, {"seconds": seconds, "images_per_s": round(m["count"] / seconds, 1),
               "mb_per_s": round(stats["source_bytes"] / seconds / 1e6, 1),
               "bytes": on_disk, "size_ratio": round(on_disk / max(stats["source_bytes"], 1), 3),
               "cpu_ms_per_image": round(1000 * cpu_s / m["count"], 3), "ceiling": bracket(before, limit())}


def storage(files: List[Path], cold: bool) -> dict:
    """Read rate of ``files`` warm, and cold (after eviction, with how much stayed cached) when asked."""
    warm = pagecache.read_rate(files, cold=False)
    evicted = pagecache.read_rate(files, cold=True) if cold else None
    return {"bytes": warm["bytes"], "warm_mb_per_s": round(warm["bytes_per_s"] / 1e6, 1),
            "cold_mb_per_s": None if evicted is None else round(evicted["bytes_per_s"] / 1e6, 1),
            "cold_resident_fraction": None if evicted is None else evicted["resident_before"]}
