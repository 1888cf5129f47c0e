"""Where a pack's samples come from; every source gives the same ``Source`` to the pack planner.

* an image folder (``folder.scan``: ImageFolder layout or flat),
* an index file (``index.scan_index``: CSV, JSONL or Parquet, one row per
  sample, with typed fields), and
* WebDataset tar shards (``shards.scan_shards``: a folder of them, a brace
  pattern, a URL prefix of them), their members typed fields.
"""
from __future__ import annotations

from typing import Callable, Optional

from ..errors import OptionError
from ..storage.store import Store, is_url
from .folder import Source, scan
from .index import scan_index
from .shards import is_shard_name, is_shards, scan_shards


def scan_source(src, opts, storage_options: Optional[dict] = None, map_fn: Callable = map) -> Source:
    """The source a pack with ``opts`` (``pixfeed.packers.options.PackOptions``) reads; ``map_fn`` walks
    WebDataset shards, a shard per job (``shards.scan_shards``)."""
    if opts.index is not None:
        return scan_index(opts.index, src, image_column=opts.image_column, fields=opts.field,
                          class_column=opts.class_column, per_box=opts.per_box, storage_options=storage_options,
                          fill=opts.fill, class_names=opts.class_names, on_error=opts.on_error,
                          allow_outside_src=opts.allow_outside_src)
    if src is None:
        raise OptionError("pack: no source given; only an index file (--index FILE) holding its images' bytes "
                          "packs without SRC")
    if is_shards(src) or (is_url(src) and _only_shards(src, storage_options)):
        return scan_shards(src, opts.image_ext, opts.on_error, storage_options, fields=opts.field, map_fn=map_fn,
                           class_names=opts.class_names)
    for option in ("image_ext", "field", "per_box", "class_names"):
        if getattr(opts, option):
            raise OptionError(f"--{option.replace('_', '-')} applies to an index file or WebDataset shards as the "
                              f"source, not to the image folder {src}; leave it out")
    return scan(src, opts.ext, storage_options)


def _only_shards(src, storage_options: Optional[dict]) -> bool:
    names = list(Store(src, storage_options).list())
    return bool(names) and all(is_shard_name(n) for n in names)


__all__ = ["Source", "scan", "scan_index", "scan_shards", "scan_source"]
