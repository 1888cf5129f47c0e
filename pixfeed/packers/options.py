"""Pack options: those every format takes, and those only some formats take.

``PackOptions`` holds what ``pack`` was given; format-specific options
(declared per format in ``pixfeed.registry``) and store-specific ones
(``STORE_ONLY``) stay None unless given.  One rule: ``resolve`` refuses an
option that does not apply to this pack's format or store, naming the option
and what it applies to, then fills in the defaults; ``recorded`` is what the
manifest keeps: the options that took effect.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ..image.decode import parse_size
from ..errors import OptionError
from ..manifest import STORES
from ..registry import Format, format_options

ON_ERROR = ("fail", "skip")
_NOT_RECORDED = ("overwrite", "workers", "allow_outside_src", "allow_links")  # how, not what, was packed
_INDEX_ONLY = ("image_column", "class_column", "fill")
# option: (the store it applies to, its default there)
STORE_ONLY = {"size": ("pixels", 256), "resize": ("pixels", "crop"), "max_side": ("encoded", None),
              "full_check": ("encoded", False), "compression": ("pixels", None)}
QUALITY = 90  # JPEG quality of images re-encoded for --max-side


@dataclass
class PackOptions:
    store: Optional[str] = None          # "pixels" | "encoded"; None = the format's default
    size: object = None                  # pixels mode: S or "HxW" (default 256)
    resize: Optional[str] = None         # pixels mode: crop (default) | pad | stretch
    max_side: Optional[int] = None       # encoded mode: re-encode larger images to JPEG
    quality: Optional[int] = None        # with max_side (default QUALITY)
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
    fill: tuple = ()                     # index: "NAME=VALUE", the value of column NAME's null cells
    class_names: object = None           # integer labels' class names: a file (one a line, or JSON) or a list
    image_ext: Optional[str] = None      # WebDataset shards as the source: the image member's extension
    allow_outside_src: bool = False      # index: read absolute paths and paths out of SRC (docs/untrusted-data.md)
    allow_links: bool = False            # a dataset as the source: read it though it holds symbolic links
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
                                  per_box=_items(self.per_box, ","), fill=_fills(self.fill), **defaults)
        out._check()
        out._check_store(fmt, chosen=self.store is not None)
        for option, (store, default) in STORE_ONLY.items():
            if out.store == store and getattr(out, option) in (None, False):
                setattr(out, option, default)
        if out.max_side is not None and out.quality is None:
            out.quality = QUALITY
        out.size = parse_size(out.size) if out.store == "pixels" else None
        return out

    def _check_store(self, fmt: Format, chosen: bool) -> None:
        """Refuse an option of the other store mode, and --quality without --max-side."""
        for option, (store, _) in STORE_ONLY.items():
            if getattr(self, option) not in (None, False) and self.store != store:
                flag = "--" + option.replace("_", "-")
                why = "asked for" if chosen else f"the default of --format {fmt.name}"
                raise OptionError(f"{flag} ({option}=) applies to --store {store} only, and this pack stores "
                                  f"{self.store} ({why}): leave it out or pack with --store {store}")
        if self.quality is not None and self.max_side is None:
            raise OptionError("--quality (quality=) is the JPEG quality of images re-encoded for --max-side; "
                              "give --max-side N with it, or leave it out")

    def _check(self) -> None:
        if self.store not in STORES:
            raise OptionError(f"--store {self.store!r}: expected {' or '.join(STORES)}")
        if self.on_error not in ON_ERROR:
            raise OptionError(f"--on-error {self.on_error!r}: expected fail or skip")
        if self.workers is not None and self.workers < 1:
            raise OptionError(f"--workers {self.workers}: must be at least 1")
        if self.max_side is not None and self.max_side < 1:
            raise OptionError(f"--max-side {self.max_side}: must be a positive number of pixels")
        if self.quality is not None and not 1 <= self.quality <= 100:
            raise OptionError(f"--quality {self.quality}: must be between 1 and 100")
        for option in _INDEX_ONLY:
            if self.index is None and getattr(self, option):
                raise OptionError(f"--{option.replace('_', '-')} applies to an index file source only; "
                                  "give the index with --index FILE, or leave it out")

    def recorded(self, fmt: Format) -> dict:
        """The options the manifest records: the common ones and ``fmt``'s own."""
        foreign = set(format_options()) - set(fmt.options)
        foreign |= {k for k, (store, _) in STORE_ONLY.items() if store != self.store}
        if self.max_side is None:
            foreign.add("quality")
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in foreign and k not in _NOT_RECORDED}
        if "size" in out:
            out["size"] = list(self.size)
        if self.index is None:  # a folder source: the index options did not apply
            for option in ("index", *_INDEX_ONLY):
                del out[option]
        out.update(field=list(self.field), per_box=list(self.per_box))
        if isinstance(out["class_names"], (str, bytes)) or hasattr(out["class_names"], "__fspath__"):
            out["class_names"] = str(out["class_names"])  # the file named (the names are the manifest's classes)
        elif out["class_names"] is not None:
            out["class_names"] = list(out["class_names"])
        for option in ("field", "per_box", "image_ext", "fill", "class_names"):  # recorded where they were given
            if option in out and not out[option]:
                del out[option]
        if "fill" in out:
            out["fill"] = list(out["fill"])
        return out


def _fills(value) -> tuple:
    """``fill`` as a tuple of "NAME=VALUE": from {name: value} (a value not text as JSON), "NAME=VALUE"
    or a sequence of them."""
    if isinstance(value, dict):
        import json

        return tuple(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in value.items())
    items = _items(value, None) if not isinstance(value, str) else (value,)
    for item in items:
        if "=" not in item or not item.partition("=")[0].strip():
            raise OptionError(f"--fill {item!r}: expected NAME=VALUE, e.g. caption= (empty text) or count=-1")
    return tuple(items)


def _items(value, sep) -> tuple:
    """A tuple of option values from None, one string (split at ``sep``), or a sequence of them."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    return tuple(p.strip() for v in items for p in (v.split(sep) if sep else [v]) if p.strip())
