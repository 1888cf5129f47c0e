"""Peak memory and CPU time of this process and its DataLoader workers, from /proc.

* Main-process peak: ``VmHWM`` of /proc/self/status, reset before each
  measurement by writing ``5`` to /proc/self/clear_refs (Linux >= 4.0); where
  that is refused the figure is the process's lifetime peak and
  ``ProcUsage.main_peak_reset`` says so.
* Worker peak: the children of every thread of this process are sampled;
  ``VmHWM`` is itself each child's running peak, so the sum over the children
  alive at one sample is their peak together, and the figure is the largest
  such sum (workers of different epochs are not added up).  Pages shared with
  the parent count in every child, as RSS always does.
* CPU time: ``getrusage`` of this process (up to ``mark``) plus that of
  reaped children, so the workers must have exited (loader deleted) before ``stop``.

Plain /proc reads rather than psutil, so the benchmark needs no extra package.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Set

SAMPLE_EVERY_S = 0.05


def _hwm_mb(pid: str) -> Optional[float]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def children() -> List[str]:
    """Process ids of this process's children (from every thread)."""
    pids: List[str] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids.extend((task / "children").read_text().split())
        except OSError:
            continue
    return pids


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@dataclass
class ProcUsage:
    """Samples this process and its children between ``start`` and ``stop``."""
    main_peak_reset: bool = False
    workers_peak_mb: float = 0.0
    workers_seen: Set[str] = field(default_factory=set)
    _before: Set[str] = field(default_factory=set)  # children already running at start (an earlier loader's)
    _cpu0: tuple = (0.0, 0.0)
    _main_cpu: Optional[float] = None
    _last: float = 0.0

    def start(self) -> "ProcUsage":
        self.main_peak_reset = _reset_peak()
        self._before = set(children())
        self._cpu0 = (_cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN))
        return self

    def sample(self, force: bool = False) -> None:
        """Record the workers' peaks; cheap to call often (at most every SAMPLE_EVERY_S)."""
        now = time.perf_counter()
        if not force and now - self._last < SAMPLE_EVERY_S:
            return
        self._last = now
        pids = [pid for pid in children() if pid not in self._before]
        self.workers_seen.update(pids)
        together = sum(mb for mb in map(_hwm_mb, pids) if mb is not None)
        self.workers_peak_mb = max(self.workers_peak_mb, together)

    def mark(self) -> None:
        """End the main process's CPU count here (before tearing workers down)."""
        self._main_cpu = _cpu_s(resource.RUSAGE_SELF) - self._cpu0[0]

    def stop(self) -> dict:
        main = self._main_cpu if self._main_cpu is not None else _cpu_s(resource.RUSAGE_SELF) - self._cpu0[0]
        workers = _cpu_s(resource.RUSAGE_CHILDREN) - self._cpu0[1]
        return {"main_peak_mb": round(_hwm_mb("self") or 0.0, 1),
                "workers_peak_mb": round(self.workers_peak_mb, 1), "workers_seen": len(self.workers_seen),
                "main_cpu_s": round(main, 3), "workers_cpu_s": round(workers, 3),
                "cpu_s": round(main + workers, 3)}
