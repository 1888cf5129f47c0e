"""How many CPUs this process may really use.

``os.cpu_count()`` reports the host's cores; a container may be allowed far
fewer.  The usable count is the smallest of:

* the CPU affinity mask (``os.sched_getaffinity``), and
* the cgroup CPU quota, rounded up: cgroup v2 ``cpu.max`` ("quota period" or
  "max"), else cgroup v1 ``cpu.cfs_quota_us / cpu.cfs_period_us`` (-1 = none).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

CGROUP_ROOT = Path("/sys/fs/cgroup")


def read_setting(path: Path) -> Optional[str]:
    """A kernel setting file's text, stripped, or None when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: Optional[Path] = None) -> Optional[float]:
    """CPUs allowed by the cgroup quota, or None when there is no quota."""
    root = CGROUP_ROOT if root is None else root
    v2 = read_setting(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        if quota == "max":
            return None
        try:
            return int(quota) / int(period or 100000)
        except ValueError:
            return None
    quota, period = read_setting(root / "cpu" / "cpu.cfs_quota_us"), read_setting(root / "cpu" / "cpu.cfs_period_us")
    if quota is None:
        quota, period = read_setting(root / "cpu.cfs_quota_us"), read_setting(root / "cpu.cfs_period_us")
    try:
        q, p = int(quota), int(period)
    except (TypeError, ValueError):
        return None
    return q / p if q > 0 and p > 0 else None


def affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_cpus(root: Optional[Path] = None) -> int:
    """CPUs this process may use: min(affinity, ceil(cgroup quota)), at least 1."""
    cpus = affinity_cpus()
    limit = cgroup_cpu_limit(root)
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)
