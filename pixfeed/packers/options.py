"""Pack options: those every format takes, and those only some formats take.

``PackOptions`` holds what ``pack`` was given; format-specific options
(declared per format in ``pixfeed.registry``) stay None unless given.
``resolve`` refuses an option given for a format that does not take it,
naming the option and the formats that do, and fills in the format's
defaults; ``recorded`` is what the manifest keeps: the options that applied.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ..decode import parse_size
from ..errors import OptionError
from ..manifest import STORES
from ..registry import Format, format_options

ON_ERROR = ("fail", "skip")
_NOT_RECORDED = ("overwrite", "workers")  # how, not what, was packed
_INDEX_ONLY = ("image_column", "field", "class_column", "per_box")


@dataclass
class PackOptions:
    store: Optional[str] = None          # "pixels" | "encoded"; None = the format's default
    size: object = 256                   # pixels mode: S or "HxW"
    resize: str = "crop"                 # crop | pad | stretch
    max_side: Optional[int] = None       # encoded mode: re-encode larger images to JPEG
    quality: int = 90
    ext: Optional[str] = None
    workers: Optional[int] = None
    on_error: str = "fail"
    overwrite: bool = False
    max_pixels: Optional[int] = None     # decompression-bomb limit; None = Pillow's
    full_check: bool = False             # encoded mode: decode every image while packing
    # an index file as the source (pixfeed.sources.index)
    index: Optional[str] = None          # CSV, JSONL or Parquet: one row per sample
    image_column: Optional[str] = None
    field: tuple = ()                    # "NAME:TYPE" overrides of inferred field types
    class_column: Optional[str] = None
    per_box: tuple = ()                  # fields with one row per box
    # format-specific (pixfeed.registry declares which format takes which, and its default)
    shard_size: Optional[int] = None     # wds
    shard_bytes: Optional[int] = None    # wds
    shuffle: Optional[bool] = None       # wds
    seed: Optional[int] = None           # wds
    compression: Optional[str] = None    # hdf5

    @classmethod
    def create(cls, **options) -> "PackOptions":
        """PackOptions from keyword arguments; an unknown name raises OptionError."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise OptionError(f"unknown pack option(s) {', '.join(unknown)}; expected some of {', '.join(sorted(names))}")
        return cls(**options)

    def resolve(self, fmt: Format) -> "PackOptions":
        """A checked copy for ``fmt``: its defaults filled in, size parsed; raise OptionError
        for a bad value or an option ``fmt`` does not take."""
        for option, takers in format_options().items():
            if getattr(self, option) is not None and option not in fmt.options:
                flag = "--" + option.replace("_", "-")
                raise OptionError(f"{flag} ({option}=) applies to format {' and '.join(takers)} only, "
                                  f"not {fmt.name}; leave it out or pack with --format {takers[0]}")
        defaults = {k: v for k, v in fmt.options.items() if getattr(self, k) is None}
        out = dataclasses.replace(self, store=self.store or fmt.default_store, field=_items(self.field, None),
                                  per_box=_items(self.per_box, ","), **defaults)
        out._check()
        out.size = parse_size(out.size) if out.store == "pixels" else None
        return out

    def _check(self) -> None:
        if self.store not in STORES:
            raise OptionError(f"--store {self.store!r}: expected {' or '.join(STORES)}")
        if self.on_error not in ON_ERROR:
            raise OptionError(f"--on-error {self.on_error!r}: expected fail or skip")
        if self.workers is not None and self.workers < 1:
            raise OptionError(f"--workers {self.workers}: must be at least 1")
        if self.max_side is not None and self.max_side < 1:
            raise OptionError(f"--max-side {self.max_side}: must be a positive number of pixels")
        if not 1 <= self.quality <= 100:
            raise OptionError(f"--quality {self.quality}: must be between 1 and 100")
        for option in _INDEX_ONLY:
            if self.index is None and getattr(self, option):
                raise OptionError(f"--{option.replace('_', '-')} applies to an index file source only; "
                                  "give the index with --index FILE, or leave it out")

    def recorded(self, fmt: Format) -> dict:
        """The options the manifest records: the common ones and ``fmt``'s own."""
        foreign = set(format_options()) - set(fmt.options)
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in foreign and k not in _NOT_RECORDED}
        out["size"] = list(self.size) if self.size else None
        if self.index is None:  # a folder source: the index options did not apply
            for option in ("index", *_INDEX_ONLY):
                del out[option]
        else:
            out.update(field=list(self.field), per_box=list(self.per_box))
        return out


def _items(value, sep) -> tuple:
    """A tuple of option values from None, one string (split at ``sep``), or a sequence of them."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    return tuple(p.strip() for v in items for p in (v.split(sep) if sep else [v]) if p.strip())
