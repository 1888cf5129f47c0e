"""Counts and sizes in words for messages: ``plural(1, "image")`` is "1 image", ``plural(60, "image")``
"60 images", ``human_bytes(11.8e6)`` "11.8 MB"."""
from __future__ import annotations

import re
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


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """``text`` safe to print: control characters (terminal escape sequences, carriage returns, newlines,
    bidi overrides) shown as Python escapes (``\\x1b``), so names and cells from input cannot move the
    cursor, retitle the terminal or forge a line of output.  Used where a message quotes input."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(text))


def printable_json(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``, which escapes only C0 controls) with every other
    character ``printable`` escapes written as a JSON escape (``\\u009b``, ``\\u202e``): still the same
    JSON, and a terminal shows it as text.  Such characters can only stand inside JSON strings."""
    return _BEYOND_C0.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_BEYOND_C0 = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # _CONTROL but C0 (JSON escapes those)
