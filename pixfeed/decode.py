"""Deprecated path, kept for one release: ``pixfeed.decode`` is now ``pixfeed.image.decode``."""
from .image.decode import *  # noqa: F401,F403
from .image.decode import decode, sniff  # noqa: F401
