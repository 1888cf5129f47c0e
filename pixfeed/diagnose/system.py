"""What this process may use: CPUs, memory and shared memory.

Every probe takes the paths it reads (cgroup root, ``/proc/meminfo``, the
shared-memory directory) so that tests can point it at fake files.

* CPUs: ``pixfeed.machine.cpus`` (affinity and cgroup quota) against ``os.cpu_count()``.
* Memory: the cgroup limit (v2 ``memory.max``, v1 ``memory/memory.limit_in_bytes``;
  v1 reports "no limit" as a huge number) and what is free: ``MemAvailable``,
  or less when the cgroup's limit minus its usage is smaller.
* Shared memory: ``os.statvfs`` of the directory against the batches a loader
  keeps in flight (batch bytes x workers x prefetch), with the same
  ``SHM_FRACTION`` headroom that ``make_loader`` uses.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

from pixfeed.machine import cpus
from pixfeed.machine.memory import MEMINFO, cgroup_memory, meminfo
from pixfeed.diagnose.finding import INFO, OK, WARN, Finding, size
from pixfeed.loaders.plan import default_workers
from pixfeed.loaders.shm import SHM_DIR, SHM_FRACTION

LOW_MEMORY = 2 * 2**30


def _workers_advice(usable: int) -> str:
    """make_loader's worker rule for ``usable`` CPUs, in words a user acts on."""
    if usable < 2:
        return ("read in the training process (num_workers=0, what make_loader picks): worker "
                "processes would take turns with training on the one CPU")
    return f"at most {default_workers(usable)} loader workers (make_loader's rule)"


def check_cpus(root: Optional[Path] = None) -> Finding:
    host, affinity, quota = os.cpu_count() or 1, cpus.affinity_cpus(), cpus.cgroup_cpu_limit(root)
    usable = cpus.available_cpus(root)
    value = f"{usable} usable of {host} (affinity {affinity}, cgroup quota {'none' if quota is None else f'{quota:g}'})"
    data = {"os_cpu_count": host, "affinity": affinity, "cgroup_quota": quota, "usable": usable}
    if usable < host:
        return Finding("cpus", value, f"size worker pools by {usable}, not os.cpu_count()={host}: "
                       f"{_workers_advice(usable)}", WARN, data)
    return Finding("cpus", value, _workers_advice(usable), OK, data)


def check_memory(root: Optional[Path] = None, meminfo_path: Path = MEMINFO) -> Finding:
    cg, info = cgroup_memory(root), meminfo(meminfo_path)
    total, free = info.get("MemTotal"), info.get("MemAvailable")
    limit = cg["limit"]
    if limit is not None:
        room = limit - (cg["usage"] or 0)
        free = room if free is None else min(free, room)
    value = (f"limit {'none' if limit is None else size(limit)} (cgroup), "
             f"{'?' if free is None else size(free)} free, host {'?' if total is None else size(total)}")
    data = {"cgroup_limit": limit, "cgroup_usage": cg["usage"], "free": free, "host_total": total}
    if free is not None and free < LOW_MEMORY:
        return Finding("memory", value, "little memory free: use fewer workers or a smaller prefetch_factor, "
                       "or raise the container's memory limit", WARN, data)
    if limit is not None and (total is None or limit < total):
        return Finding("memory", value, f"the container is killed at {size(limit)}, not at the host's total: keep "
                       "workers x per-worker memory + batches in flight below it", INFO, data)
    return Finding("memory", value, "no container limit below the host's memory", OK, data)


def shm_need(batch_bytes: int, workers: int, prefetch: int) -> int:
    """Bytes of batches a loader keeps in shared memory."""
    return batch_bytes * workers * prefetch


def check_shm(need: int, path: str = SHM_DIR, loader: str = "a loader") -> Finding:
    """``need`` bytes of batches in flight against ``path``'s free space; ``loader`` says whose, in words."""
    try:
        st = os.statvfs(path)
    except OSError:
        return Finding("shared memory", f"{path}: absent", "workers hand batches over another way here", INFO)
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    value = f"{path}: {size(total)}, {size(free)} free; {loader} need {size(need)}"
    data = {"path": path, "total": total, "free": free, "need": need}
    if not need:
        return Finding("shared memory", f"{path}: {size(total)}, {size(free)} free", "no loader workers here: "
                       "batches do not pass through shared memory", OK, data)
    if need <= free * SHM_FRACTION:
        return Finding("shared memory", value, f"fits in {SHM_FRACTION:.0%} of the free space", OK, data)
    gib = math.ceil((need / SHM_FRACTION + total - free) / 2**30)
    return Finding("shared memory", value, f"too small: run the container with --shm-size={gib}g (Kubernetes: "
                   "an emptyDir with medium: Memory), or torch.multiprocessing.set_sharing_strategy('file_system'), "
                   "or fewer workers / smaller batches", WARN, data)
