"""Counts and sizes in words for messages: ``plural(1, "image")`` is "1 image", ``plural(60, "image")``
"60 images", ``human_bytes(11.8e6)`` "11.8 MB"."""
from __future__ import annotations

from typing import Optional


def plural(n: int, noun: str, many: Optional[str] = None) -> str:
    """``n`` and ``noun``, in the plural (``many``, else noun + "s") unless n is 1."""
    return f"{n:,} {noun if n == 1 else many or noun + 's'}"


def human_bytes(n: float) -> str:
    """Bytes in decimal units, as disks are sold: '512 B', '24.6 KB', '11.8 MB'."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return str(n)
