"""One line of a diagnosis, and byte sizes as people read them.

A ``Finding`` is what ``pixfeed doctor`` reports per check: the measured
value, a status (``ok``, ``warn`` or ``info``), the recommendation, and the raw
numbers in ``data`` for ``--json``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict

OK, WARN, INFO = "ok", "warn", "info"


@dataclass
class Finding:
    check: str
    value: str
    advice: str
    status: str = OK
    data: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def size(n: float) -> str:
    """Bytes in binary units: '512 MiB', '7.8 GiB'."""
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB"
