"""``open_dataset(path)``: the right reader for a packed dataset, from its manifest."""
from __future__ import annotations

from ..manifest import read_manifest
from ..registry import reader_class


def open_dataset(path, transform=None, **kwargs):
    """Open any pixfeed dataset (a folder or a URL); keyword arguments go to the reader
    (size=, crop=, checksums=, storage_options=, cache_dir=, cache_limit=, ...)."""
    manifest = read_manifest(path, kwargs.get("storage_options"), kwargs.get("allow_links", False))
    return reader_class(manifest["format"])(path, transform, **kwargs)
