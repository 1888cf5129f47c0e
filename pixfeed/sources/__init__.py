"""Where a pack's samples come from; every source gives the same ``Source`` to the pack planner.

* an image folder (``folder.scan``: ImageFolder layout or flat), and
* an index file (``index.scan_index``: CSV, JSONL or Parquet, one row per
  sample, with typed fields).
"""
from __future__ import annotations

from typing import Optional

from .folder import Source, scan
from .index import scan_index


def scan_source(src, opts, storage_options: Optional[dict] = None) -> Source:
    """The source a pack with ``opts`` (``pixfeed.packers.options.PackOptions``) reads."""
    if opts.index is None:
        return scan(src, opts.ext, storage_options)
    return scan_index(opts.index, src, image_column=opts.image_column, fields=opts.field,
                      class_column=opts.class_column, per_box=opts.per_box, storage_options=storage_options)


__all__ = ["Source", "scan", "scan_index", "scan_source"]
