"""End-to-end format benchmark: pack and read every format beside the machine's ceilings.

``pixfeed bench [SRC]`` (``cli.py``) runs ``run_bench`` (``runner.py``) and
writes ``report.py``'s table, JSON and chart.  The runner (torch and every
format) is imported on first use, so the ``pixfeed`` command starts fast.
"""
import importlib

__all__ = ["BenchConfig", "run_bench"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("pixfeed.bench.runner"), name)
    raise AttributeError(f"module 'pixfeed.bench' has no attribute {name!r}")
