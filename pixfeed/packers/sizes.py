"""Stored-pixel sizes against the images' own: small images are not upscaled without a word.

* ``keep_source_size``: a pixels pack with no ``size`` given (default 256x256)
  of images that all share one size smaller than that on both sides (CIFAR's
  32x32, thumbnails) stores them at that size instead, and says so in a note;
  ``--size`` still upscales when asked.  The check reads headers in source
  order and stops at the first image that is not so (one read for a folder of
  photos), so it costs one header read an image only where it applies.
* ``upscale_note``: after a pixels pack, how many images were enlarged to the
  stored size, by how much a side, and what that made of the source's bytes
  (each task counts them: ``TaskResult.upscaled``, ``upscale_max``), with the
  way out (their own size with ``--size``, or ``--store encoded``).
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from ..console.words import plural
from ..errors import PixfeedError
from ..image.decode import oriented_size
from ..storage.bounded import IMAGE_BYTES, read_file
from .options import PackOptions


def scale(source_shape, size, resize: Optional[str]) -> float:
    """How much a side of an image of ``source_shape`` (H, W) is enlarged to fill ``size`` (H, W) by ``resize``:
    the cover scale (crop; stretch, its larger side ratio), the fit scale (pad)."""
    ratios = (size[0] / source_shape[0], size[1] / source_shape[1])
    return min(ratios) if resize == "pad" else max(ratios)


def _shape(source, i: int, data) -> Optional[Tuple[int, int]]:
    """(H, W) of source image ``i`` from its header; None when it cannot be read here (the pack names it)."""
    try:
        if isinstance(data, Exception):
            return None
        if data is None:
            data = read_file(source.root / source.paths[i], IMAGE_BYTES, source.where(i), "image file")
        w, h = oriented_size(bytes(data), source.where(i))
        return h, w
    except (PixfeedError, OSError):
        return None


def keep_source_size(source, opts: PackOptions) -> PackOptions:
    """``opts`` with ``size`` the images' own when every image of ``source`` has that one size, smaller than
    ``opts.size`` on both sides (a note in ``source.notes`` says so); else ``opts`` as it is."""
    if opts.store != "pixels" or not len(source):
        return opts
    common = None
    for i, data in source.fetch(range(len(source))):
        shape = _shape(source, i, data)
        if shape is None or (common is not None and shape != common) or \
                shape[0] >= opts.size[0] or shape[1] >= opts.size[1]:
            return opts
        common = shape
    h, w = common
    source.notes.append(f"every image is {h}x{w}, smaller than the default {opts.size[0]}x{opts.size[1]}: stored at "
                        f"their own size, not upscaled (--size {opts.size[0]} upscales them)")
    return dataclasses.replace(opts, size=(h, w))


def upscale_note(results: List, opts: PackOptions, source) -> Optional[str]:
    """The pack's note on images enlarged to the stored size, from the tasks' counts; None when none was."""
    upscaled = sum(r.upscaled for r in results)
    if not upscaled:
        return None
    most, h, w = max(r.upscale_max for r in results), *opts.size
    stored, given = sum(r.stored_bytes for r in results), int(source.sizes.sum())
    ratio = f"; the pack stores {stored / given:,.0f}x its source files' bytes" if given and stored > given else ""
    return (f"{upscaled:,} of {plural(len(source), 'image')} were smaller than {h}x{w} and were upscaled to it (up "
            f"to {most:.1f}x a side{ratio}): no detail is gained; store them at their own size (--size S) or "
            "encoded (--store encoded)")
