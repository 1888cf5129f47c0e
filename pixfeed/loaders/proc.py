"""What a reading process or thread is doing, from Linux's ``/proc``.

The loader's watchdog (``watchdog.py``) tells a slow reader from a stuck one
by these counters, and names the cause when one is stuck:

* progress: CPU time (``stat`` utime + stime), major page faults (reads
  through a memory map) and bytes read by system calls (``io`` rchar).  Any
  change is progress: a slow network read moves rchar, a long decode moves
  the CPU time; a read that blocks moves none of them.
* state: ``T`` stopped (SIGSTOP, a debugger), ``D`` waiting on the kernel
  (storage), ``Z`` dead; ``wchan`` the kernel function it waits in;
  ``syscall`` its first argument, read as a file descriptor, names the file a
  blocked ``read`` waits on.

Everything is best effort: a field that cannot be read is left out (not Linux,
no permission), so the watchdog still bounds the wait on other systems.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return ""


@dataclass(frozen=True)
class Task:
    state: str  # one letter from /proc/PID/stat; "" when unknown
    progress: Tuple[int, ...]  # (cpu ticks, major faults, bytes read); compare, do not interpret
    waiting_in: str  # kernel function (wchan), "" when unknown
    file: str  # the file its current system call works on, "" when none

    def __str__(self) -> str:
        parts = [f"state {self.state}" if self.state else "", f"waiting in {self.waiting_in}" if self.waiting_in else "",
                 f"on {self.file}" if self.file else ""]
        return ", ".join(p for p in parts if p) or "state unknown"


def task(pid: int, tid: Optional[int] = None) -> Task:
    """A snapshot of process ``pid`` (or its thread ``tid``)."""
    base = Path(f"/proc/{pid}") if tid is None else Path(f"/proc/{pid}/task/{tid}")
    stat = _read(base / "stat").rpartition(")")[2].split()
    state = stat[0] if stat else ""
    ticks = (int(stat[9]), int(stat[11]) + int(stat[12])) if len(stat) > 12 else ()
    rchar = [int(line.split()[1]) for line in _read(base / "io").splitlines() if line.startswith("rchar:")]
    wchan = _read(base / "wchan")
    return Task(state, (*ticks, *rchar), "" if wchan == "0" else wchan, _syscall_file(pid, base))


def _syscall_file(pid: int, base: Path) -> str:
    fields = _read(base / "syscall").split()
    if len(fields) < 2 or not fields[1].startswith("0x"):
        return ""
    fd = int(fields[1], 16)
    if fd > 1 << 20:  # an address, not a file descriptor
        return ""
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""
    return target if target.startswith("/") else ""


def oom_kills() -> int:
    """Processes the out-of-memory killer killed in this process's memory cgroup so far (0 if unknown)."""
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, group = line.split(":", 2)
        v1 = "memory" in controllers.split(",")
        if not v1 and controllers:
            continue
        file = Path("/sys/fs/cgroup") / ("memory" if v1 else "") / group.lstrip("/") / \
            ("memory.oom_control" if v1 else "memory.events")
        counts = [int(row.split()[1]) for row in _read(file).splitlines() if row.startswith("oom_kill ")]
        if counts:
            return counts[0]
    return 0
