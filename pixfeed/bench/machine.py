"""A short description of the machine a benchmark ran on, for the report."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Optional

from ..machine.cpus import available_cpus


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> Optional[float]:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError):
        return None


def _filesystem(path: Path) -> str:
    try:
        out = subprocess.run(["df", "-T", str(path)], capture_output=True, text=True, timeout=5).stdout
        return out.splitlines()[1].split()[1]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def _version(module: str) -> Optional[str]:
    try:
        return getattr(__import__(module), "__version__", "installed")
    except ImportError:
        return None


def describe(work: Path) -> dict:
    return {"cpu": _cpu_model(), "usable_cpus": available_cpus(), "host_cpus": os.cpu_count(),
            "memory_gb": _memory_gb(), "os": f"{platform.system()} {platform.release()}",
            "filesystem": _filesystem(work), "python": platform.python_version(),
            "versions": {m: _version(m) for m in ("torch", "numpy", "PIL", "simplejpeg", "lmdb", "h5py", "webdataset")}}


def summary(m: dict) -> str:
    """One line, e.g. for the table's heading."""
    return (f"{m['cpu']}, {m['usable_cpus']} usable CPUs, {m['memory_gb']} GB RAM, {m['os']}, "
            f"{m['filesystem']} storage, Python {m['python']}, torch {m['versions']['torch']}")
