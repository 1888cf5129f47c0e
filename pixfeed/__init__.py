"""pixfeed: pack image folders into fast formats and feed them to GPUs."""
from __future__ import annotations

import importlib

from .registry import FORMATS

__version__ = "0.1.0"

# public name -> module that defines it; imported on first use so that
# ``import pixfeed`` stays light (no torch, lmdb, h5py or webdataset).
_EXPORTS = {
    "pack": "pixfeed.packers",
    "pack_samples": "pixfeed.packers",
    "open_dataset": "pixfeed.datasets",
    "read_manifest": "pixfeed.manifest",
    "PixfeedError": "pixfeed.errors",
    "make_loader": "pixfeed.loaders",
    "mix": "pixfeed.mixing",
    "DevicePrefetcher": "pixfeed.loaders",
    "profile_loader": "pixfeed.diagnose.stall",
    "StallMeter": "pixfeed.diagnose.stall",
    "autotune": "pixfeed.loaders.tune",
    # every format's reader class (pixfeed.registry)
    **{f.reader_name: "pixfeed.datasets" for f in FORMATS.values()},
}
__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pixfeed' has no attribute {name!r}")


def __dir__():
    return __all__
