"""Run a process under a memory limit: a child of this process's cgroup v1 memory controller.

For the larger-than-memory tests and benchmark (needs root and cgroup v1's
``memory`` controller, as on the CI machine)::

    with memory_cgroup(32 << 20) as group:       # a fresh child cgroup, removed afterwards
        subprocess.run([sys.executable, "-c", f"...join({str(group)!r})..."])

``join(group)`` moves the calling process into it; the memory it already has
stays charged where it was (v1 moves no charges by default), so only what it
allocates and reads from then on counts against the limit.  That is the point:
a reader that imported torch can be held to a page cache far smaller than its
dataset.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from pixfeed.machine.memory import own_cgroups


def cgroup_parent() -> Optional[Path]:
    """This process's v1 memory cgroup when a child can be made in it (root, v1 controller), else None."""
    parent = own_cgroups()[0]
    ok = (parent / "memory.limit_in_bytes").exists() and os.access(parent, os.W_OK)
    return parent if ok else None


@contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A child cgroup limited to ``limit`` bytes (memory plus page cache), removed on exit."""
    parent = cgroup_parent()
    if parent is None:
        raise OSError("no writable cgroup v1 memory controller here (needs root and /sys/fs/cgroup/memory)")
    group = parent / f"pixfeed-{os.getpid()}-{os.urandom(4).hex()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit))
        yield group
    finally:
        group.rmdir()


def join(group: Path) -> None:
    (Path(group) / "cgroup.procs").write_text(str(os.getpid()))


def usage(group: Path) -> dict:
    """The cgroup's peak usage and how often it hit its limit."""
    read = lambda name: int((Path(group) / name).read_text())  # noqa: E731
    return {"max_usage": read("memory.max_usage_in_bytes"), "failcnt": read("memory.failcnt"),
            "limit": read("memory.limit_in_bytes")}
