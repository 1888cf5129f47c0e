"""Where every resize and crop lands: the one place for boxes, offsets and rounding.

The exact path (``decode.py``), the fast path (``_fastdecode.py``) and the
stored-pixel crop (``datasets/base.py``) all take their geometry from here, with
torchvision's rounding:

* ``Resize(R)`` (an int): the short side becomes R, the long side
  ``int(R * long / short)`` (truncated).  ``cover`` generalises it to an HxW box:
  the side that binds becomes exact, the other is truncated the same way.
* ``CenterCrop``: offset ``int(round((outer - inner) / 2.0))`` (Python rounds
  halves to even, so a margin of 3 gives an offset of 2, not 1).
* ``crop_ratio`` r (timm's ``crop_pct``): ``Resize(floor(S / r))`` then
  ``CenterCrop(S)``; r = 224/256 is the usual evaluation transform, 1.0
  resizes straight to S.
* ``RandomResizedCrop.get_params``: ten tries of a log-uniform aspect and a
  uniform area fraction, sides ``int(round(sqrt(area * aspect)))``, top then
  left drawn uniformly; else the largest center box within the ratio bounds,
  offsets floored.  The draws come from a NumPy generator.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

from ..errors import OptionError

Size = Tuple[int, int]  # (H, W)
Box = Tuple[int, int, int, int]  # (left, top, right, bottom)
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


class Plan(NamedTuple):
    """Take ``box`` of the oriented source (None: all of it, ``src`` (W, H)), resize it
    to ``scaled`` (W, H), then crop (or pad) to the output at ``offset``, then maybe flip."""
    box: Optional[Box]
    src: Tuple[int, int]
    scaled: Tuple[int, int]
    offset: Tuple[int, int]  # crop: top-left of the kept window; pad: where the image goes
    flip: bool = False


def check_crop_ratio(value) -> float:
    """A crop ratio in (0, 1], else OptionError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise OptionError(f"crop_ratio {value!r}: expected a number in (0, 1], e.g. 0.875 (= 224/256, "
                          "torchvision's Resize(256) + CenterCrop(224)) or 1.0 (resize straight to size)")
    return float(value)


def resize_target(side: int, crop_ratio: float) -> int:
    """floor(side / crop_ratio), tolerant of float error (224 / (224 / 256) is 256)."""
    return int(side / crop_ratio + 1e-6)


def cover(w: int, h: int, size: Size, crop_ratio: float = 1.0) -> Tuple[int, int]:
    """(W, H) after scaling w x h to cover ``size`` / crop_ratio, torchvision's truncation."""
    th, tw = resize_target(size[0], crop_ratio), resize_target(size[1], crop_ratio)
    if th * w >= tw * h:  # the height binds (for a square box: h is the short side)
        return max(1, int(th * w / h)), th
    return tw, max(1, int(tw * h / w))


def fit(w: int, h: int, size: Size) -> Tuple[int, int]:
    """(W, H) after scaling w x h to fit inside ``size`` (letterbox)."""
    scale = min(size[0] / h, size[1] / w)
    return max(1, round(w * scale)), max(1, round(h * scale))


def center_offset(outer: int, inner: int) -> int:
    """torchvision's CenterCrop offset of an ``inner`` window in ``outer`` pixels."""
    return int(round((outer - inner) / 2.0))


def random_box(w: int, h: int, rng, scale=SCALE, ratio=RATIO) -> Box:
    """The box of torchvision's ``RandomResizedCrop.get_params``, drawn from ``rng``."""
    area = w * h
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            return left, top, left + cw, top + ch
    if w / h < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif w / h > max(ratio):
        cw, ch = int(round(h * max(ratio))), h
    else:
        cw, ch = w, h
    left, top = (w - cw) // 2, (h - ch) // 2
    return left, top, left + cw, top + ch


def plan(w: int, h: int, size: Size, resize_mode: str = "crop", crop: str = "center", rng=None,
         crop_ratio: float = 1.0) -> Plan:
    """The geometry of one output for an oriented w x h image."""
    H, W = size
    if crop == "random":
        x0, y0, x1, y1 = random_box(w, h, rng)
        return Plan((x0, y0, x1, y1), (x1 - x0, y1 - y0), (W, H), (0, 0), bool(rng.random() < 0.5))
    if resize_mode == "stretch":
        return Plan(None, (w, h), (W, H), (0, 0))
    if resize_mode == "pad":
        rw, rh = fit(w, h, size)
        return Plan(None, (w, h), (rw, rh), ((W - rw) // 2, (H - rh) // 2))
    rw, rh = cover(w, h, size, crop_ratio)
    return Plan(None, (w, h), (rw, rh), (center_offset(rw, W), center_offset(rh, H)))


def center_slices(h: int, w: int, size: Size) -> Tuple[slice, slice]:
    """CenterCrop(size) of an h x w array as (rows, cols) slices; size must fit."""
    top, left = center_offset(h, size[0]), center_offset(w, size[1])
    return slice(top, top + size[0]), slice(left, left + size[1])
