"""Diagnose: ``pixfeed doctor`` (doctor.py), the stall profiler
(``StallMeter`` and ``profile_loader`` in stall.py, the verdict in report.py,
the per-stage split in stages.py).  ``autotune`` lives with the loaders
(``pixfeed/loaders/tune.py``), which use it for ``num_workers="tune"``.

Nothing is imported here, so the CLI can register its commands without
importing torch; ``pixfeed.profile_loader`` etc. import on first use.
"""
