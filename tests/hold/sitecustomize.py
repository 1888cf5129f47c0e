"""Test-only: a Python process started with this folder on PYTHONPATH holds its read of an image
``P`` while a FIFO ``P.hold`` lies beside it, until a writer opens the FIFO and closes it.

The signal and killed-driver tests (``test_pack_failures.py``, ``test_ray.py``) hold a pack midway
with it: a FIFO named as an image used to do that, and pixfeed now refuses one without reading it.
Python imports ``sitecustomize`` at start-up, before any pixfeed module takes ``read_file``, so pack
workers (forked) and Ray workers (started with this PYTHONPATH) read through the hold too."""
import os


def _install() -> None:
    try:
        from pixfeed.storage import bounded
    except ImportError:
        return
    real = bounded.read_file

    def read_file(path, *args, **kwargs):
        hold = f"{os.fspath(path)}.hold"
        if os.path.exists(hold):
            with open(hold, "rb") as fifo:  # blocks until the test opens the write end, reads until it closes
                fifo.read()
        return real(path, *args, **kwargs)

    bounded.read_file = read_file


_install()
