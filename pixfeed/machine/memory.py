"""How much memory this process may use, and how much of it the page cache may hold.

* ``cgroup_memory(root)``: the limit and usage files of one cgroup directory
  (v2 ``memory.max`` / ``memory.current``, v1 ``memory.limit_in_bytes`` /
  ``memory.usage_in_bytes``; v1 says "no limit" with a huge number).
* ``own_cgroups()``: this process's memory cgroup and its ancestors, from
  ``/proc/self/cgroup`` (the v1 ``memory`` controller's line, else the v2
  ``0::`` line), innermost first; a container sees its own as ``/``.
* ``page_cache_room()``: bytes of file data that can stay cached for this
  process: ``MemAvailable`` (free memory plus reclaimable cache), or less when
  a cgroup's limit minus its non-cache usage is smaller.  A dataset larger than
  this is read from the disk every epoch: ``fits_in_page_cache`` says which
  (with ``CACHE_FRACTION`` headroom), for ``make_loader``'s plan and for the
  readers, which map a dataset that fits and read one that does not with
  ``pread`` (no mapped pages to count against the process or to reclaim).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from pixfeed.machine.cpus import CGROUP_ROOT, read_setting

MEMINFO = Path("/proc/meminfo")
PROC_CGROUP = Path("/proc/self/cgroup")
NO_LIMIT = 2**60  # cgroup v1 says "unlimited" with PAGE_COUNTER_MAX, about 2**63
CACHE_FRACTION = 0.8  # of the page-cache room a dataset may fill and still count as cached


def _cgroup_bytes(root: Path, v2: str, v1: str) -> Optional[int]:
    for text in (read_setting(root / v2), read_setting(root / "memory" / v1), read_setting(root / v1)):
        if text is not None:
            return int(text) if text.isdigit() and int(text) < NO_LIMIT else None
    return None


def cgroup_memory(root: Optional[Path] = None) -> Dict[str, Optional[int]]:
    """{"limit", "usage"} in bytes from the cgroup files; None where absent or unlimited."""
    root = CGROUP_ROOT if root is None else root
    return {"limit": _cgroup_bytes(root, "memory.max", "memory.limit_in_bytes"),
            "usage": _cgroup_bytes(root, "memory.current", "memory.usage_in_bytes")}


def meminfo(path: Path = MEMINFO) -> Dict[str, int]:
    """/proc/meminfo fields in bytes."""
    fields = {}
    for line in (read_setting(path) or "").splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return fields


def own_cgroups(proc: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> List[Path]:
    """This process's memory cgroup directory and its ancestors up to ``root``, innermost first."""
    lines = [line.split(":", 2) for line in (read_setting(proc) or "").splitlines() if line.count(":") >= 2]
    v1 = [path for _, controllers, path in lines if "memory" in controllers.split(",")]
    v2 = [path for number, controllers, path in lines if number == "0" and controllers == ""]
    base, rel = (root / "memory", v1[0]) if v1 and (root / "memory").is_dir() else (root, v2[0] if v2 else "/")
    parts = [p for p in rel.split("/") if p]
    return [base.joinpath(*parts[:k]) for k in range(len(parts), -1, -1)]


def memory_stat(directory: Path) -> Dict[str, int]:
    """A memory cgroup's ``memory.stat`` counters (``file``/``cache``, ``workingset_refault_file``,
    ``pgmajfault``, ...); empty where it cannot be read."""
    lines = (line.split() for line in (read_setting(Path(directory) / "memory.stat") or "").splitlines())
    return {parts[0]: int(parts[1]) for parts in lines if len(parts) >= 2 and parts[1].isdigit()}


def _cached(directory: Path) -> int:
    stat = memory_stat(directory)
    return stat.get("file", stat.get("cache", 0))


def page_cache_room(proc: Path = PROC_CGROUP, root: Path = CGROUP_ROOT, info: Path = MEMINFO) -> Optional[int]:
    """Bytes of file pages that can stay cached for this process (None when nothing can be told)."""
    rooms = [meminfo(info).get("MemAvailable")]
    for directory in own_cgroups(proc, root):
        cg = cgroup_memory(directory)
        if cg["limit"] is not None:
            rooms.append(max(cg["limit"] - max((cg["usage"] or 0) - _cached(directory), 0), 0))
    known = [room for room in rooms if room is not None]
    return min(known) if known else None


def fits_in_page_cache(nbytes: int, room: Optional[int] = None) -> bool:
    """Whether ``nbytes`` of files can stay cached (``room`` defaults to ``page_cache_room()``; unknown: yes)."""
    room = page_cache_room() if room is None else room
    return room is None or nbytes <= room * CACHE_FRACTION
