"""Tuned DataLoaders and the hand-off to the GPU."""
from pixfeed.loaders.cpus import available_cpus
from pixfeed.loaders.loader import PixfeedLoader, make_loader
from pixfeed.loaders.plan import LoaderPlan
from pixfeed.loaders.prefetch import DevicePrefetcher

__all__ = ["DevicePrefetcher", "LoaderPlan", "PixfeedLoader", "available_cpus", "make_loader"]
assert sorted(__all__) == __all__
