"""Counts in words for messages: ``plural(1, "image")`` is "1 image", ``plural(60, "image")`` "60 images"."""
from __future__ import annotations

from typing import Optional


def plural(n: int, noun: str, many: Optional[str] = None) -> str:
    """``n`` and ``noun``, in the plural (``many``, else noun + "s") unless n is 1."""
    return f"{n:,} {noun if n == 1 else many or noun + 's'}"
