"""``open_dataset(path)``: the right reader for a packed dataset, from its manifest."""
from __future__ import annotations

from ..manifest import read_manifest
from ..registry import reader_class


def open_dataset(path, transform=None, **kwargs):
    """Open any pixfeed dataset (a folder or a URL); keyword arguments go to the reader
    (size=, crop=, checksums=, storage_options=, cache_dir=, cache_limit=, ...; manifest=: what
    ``read_manifest`` returned for ``path``, not read again).  A mixture file (``mix.json``, docs/mixing.md)
    opens as the mixture it describes."""
    from ..mixing import file as mixture_file

    if mixture_file.is_mixture_file(path):
        return mixture_file.load(path, transform, **kwargs)
    if kwargs.get("manifest") is None:  # parsed once, here, for the reader too
        kwargs["manifest"] = read_manifest(path, kwargs.get("storage_options"), kwargs.get("allow_links", False))
    return reader_class(kwargs["manifest"]["format"])(path, transform, **kwargs)
