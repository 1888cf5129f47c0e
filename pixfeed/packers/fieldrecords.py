"""A record's fields on their way to a writer: parsed values (``Source.values``) to stored bytes.

In pixels mode (and for an encoded image re-encoded by ``--max-side``) the
fields that follow the image get its pack-time plan: masks and second images
are resized and cropped as it was, boxes mapped, clipped and the empty ones
dropped with the rows of the ``--per-box`` fields.  Encoded records keep
source pixels: readers apply the read-time geometry to all of them at once.
"""
from __future__ import annotations

import functools
from typing import Dict

import numpy as np

from ..errors import Location, PixfeedError, SourceError
from ..fields import codec, picture
from ..fields.array import transform
from ..sources.folder import Source


def pack_fields(source: Source, i: int, opts, plan, size, image_shape) -> Dict[str, bytes]:
    """{field name: stored bytes} of sample ``i`` in schema order; ``plan``/``size``: the image's geometry
    when its pixels were resized at pack time, ``image_shape``: its (H, W) after EXIF orientation."""
    values = {f.name: source.values[f.name][i] for f in source.schema}
    _boxes(source, i, values, plan, size)
    out, image_where = {}, Location(source.where, i)  # formatted only into an error
    for f in source.schema:
        v, where = values[f.name], Location(functools.partial(source.field_where, name=f.name), i)
        if f.type == "mask":
            out[f.name] = picture.pack_mask(_bytes(source, v, where), plan, size, opts.store, image_shape,
                                            where, image_where, opts.max_pixels)
        elif f.type == "image":
            out[f.name] = picture.pack_image(_bytes(source, v, where), plan, size, opts.store, image_shape,
                                             where, image_where, opts.max_pixels, opts.quality)
        else:
            out[f.name] = codec.encode(f, v)
    return out


def _boxes(source: Source, i: int, values: dict, plan, size) -> None:
    """Map the boxes through ``plan`` (when given) and keep the ``--per-box`` rows that go with them."""
    for f in source.schema:
        if f.type != "boxes":
            continue
        keep = np.ones(len(values[f.name]), bool)
        if plan is not None:
            values[f.name], keep = transform(values[f.name], plan, size)
        for name in source.per_box:
            if len(values[name]) != len(keep):
                raise SourceError(f"{source.field_where(i, name)}: {len(values[name])} rows, but field {f.name} "
                                  f"has {len(keep)} boxes (--per-box fields have one row per box)")
            values[name] = values[name][keep]


def _bytes(source: Source, value, where: str) -> bytes:
    """A picture field's file (a path relative to the source) or its bytes."""
    if isinstance(value, bytes):
        return value
    try:
        return source.read(value)
    except PixfeedError as e:
        raise SourceError(f"{where}: {value}: cannot read ({e})") from None
