"""Tuned DataLoaders and the hand-off to the GPU.

Names are imported on first use, so ``import pixfeed.loaders`` does not
import torch.  ``available_cpus`` lives in the core (``pixfeed.machine.cpus``, which the
packers use too) and is re-exported here.
"""
import importlib

_EXPORTS = {
    "DevicePrefetcher": "pixfeed.loaders.prefetch",
    "LoaderPlan": "pixfeed.loaders.plan",
    "PixfeedLoader": "pixfeed.loaders.loader",
    "available_cpus": "pixfeed.machine.cpus",
    "make_loader": "pixfeed.loaders.make",
}
__all__ = ["DevicePrefetcher", "LoaderPlan", "PixfeedLoader", "available_cpus", "make_loader"]
assert sorted(__all__) == __all__ == sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pixfeed.loaders' has no attribute {name!r}")
