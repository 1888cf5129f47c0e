"""End-to-end format benchmark: pack and read every format beside the machine's ceilings.

``pixfeed bench [SRC]`` (``cli.py``) runs ``run_bench`` (``runner.py``) and
writes ``report.py``'s table, JSON and chart.
"""
from pixfeed.bench.runner import BenchConfig, run_bench

__all__ = ["BenchConfig", "run_bench"]
assert sorted(__all__) == __all__
