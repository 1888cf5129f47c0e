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
  offsets floored.  The draws come from a NumPy generator, or from a record's
  ``pixfeed.seeds.Draws`` (its counter-based numbers, handed out in the same order).

``plans(w, h, size, crop, draws)`` makes a whole batch's plans in one vectorised
step (``Plans``: arrays, ``plans[j]`` sample j's ``Plan``), equal to ``plan`` with
each sample's ``Draws``: ``random_boxes`` replays the ten tries of every sample at
once (try t takes numbers 2t and 2t+1; the first that fits takes the next two for
top and left, the one after for the flip; none fits: the fallback box, number 20
for the flip).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import numpy as np

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


def random_boxes(w, h, draws: np.ndarray, scale=SCALE, ratio=RATIO) -> Tuple[np.ndarray, np.ndarray]:
    """(N x 4 int64 boxes, N bool flips) of N images ``w`` x ``h`` (arrays or ints), sample k's as ``plan``
    draws them from ``Draws(draws[k])`` (``draws``: N x 23 numbers in [0, 1), ``seeds.uniforms``)."""
    u = np.asarray(draws, dtype=np.float64)
    n = len(u)
    w = np.broadcast_to(np.asarray(w, dtype=np.int64), (n,))
    h = np.broadcast_to(np.asarray(h, dtype=np.int64), (n,))
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    target = (w * h).astype(np.float64)[:, None] * (scale[0] + (scale[1] - scale[0]) * u[:, 0:20:2])
    aspect = np.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u[:, 1:20:2])
    cw, ch = np.rint(np.sqrt(target * aspect)), np.rint(np.sqrt(target / aspect))
    fits = (cw > 0) & (cw <= w[:, None]) & (ch > 0) & (ch <= h[:, None])
    found, t = fits.any(1), fits.argmax(1)
    rows = np.arange(n)
    cw, ch = cw[rows, t].astype(np.int64), ch[rows, t].astype(np.int64)
    top = np.floor(u[rows, np.minimum(2 * t + 2, 22)] * (h - ch + 1)).astype(np.int64)
    left = np.floor(u[rows, np.minimum(2 * t + 3, 22)] * (w - cw + 1)).astype(np.int64)
    flip = u[rows, np.where(found, 2 * t + 4, 20)] < 0.5
    # none of the ten fits: the largest center box within the ratio bounds
    tall, wide = w / h < min(ratio), w / h > max(ratio)
    fw = np.where(wide, np.rint(h * max(ratio)).astype(np.int64), w)
    fh = np.where(tall, np.rint(w / min(ratio)).astype(np.int64), h)
    cw, ch = np.where(found, cw, fw), np.where(found, ch, fh)
    left, top = np.where(found, left, (w - cw) // 2), np.where(found, top, (h - ch) // 2)
    return np.stack([left, top, left + cw, top + ch], 1), flip


class Plans:
    """A batch's plans as arrays: ``box`` N x 4 (left, top, right, bottom; the whole image when not
    cropped), ``src`` N x 2 (each oriented image's W, H), ``scaled`` and ``offset`` N x 2, ``flip`` N;
    ``random``: boxes were drawn (else ``Plan.box`` is None).  ``plans[j]`` is sample j's ``Plan``."""
    __slots__ = ("box", "src", "scaled", "offset", "flip", "random")

    def __init__(self, box, src, scaled, offset, flip, random: bool) -> None:
        self.box, self.src, self.scaled, self.offset, self.flip = box, src, scaled, offset, flip
        self.random = random

    def __len__(self) -> int:
        return len(self.box)

    def __getitem__(self, j: int) -> Plan:
        scaled, offset = tuple(self.scaled[j].tolist()), tuple(self.offset[j].tolist())
        if self.random:
            box = tuple(self.box[j].tolist())
            return Plan(box, (box[2] - box[0], box[3] - box[1]), scaled, offset, bool(self.flip[j]))
        return Plan(None, tuple(self.src[j].tolist()), scaled, offset, bool(self.flip[j]))

    def __iter__(self):
        return (self[j] for j in range(len(self)))

    @classmethod
    def of(cls, plans) -> "Plans":
        """``Plans`` of a sequence of ``Plan`` (or itself)."""
        if isinstance(plans, Plans):
            return plans
        plans = list(plans)
        box = np.array([p.box if p.box is not None else (0, 0, *p.src) for p in plans], np.int64).reshape(-1, 4)
        src = np.array([p.src if p.box is None else (p.box[2], p.box[3]) for p in plans], np.int64).reshape(-1, 2)
        return cls(box, src, np.array([p.scaled for p in plans], np.int64).reshape(-1, 2),
                   np.array([p.offset for p in plans], np.int64).reshape(-1, 2),
                   np.array([bool(p.flip) for p in plans], bool), any(p.box is not None for p in plans))


def plans(w, h, size: Size, crop: str = "center", draws: Optional[np.ndarray] = None,
          crop_ratio: float = 1.0) -> Plans:
    """``plan(w[k], h[k], size, "crop", crop, Draws(draws[k]), crop_ratio)`` for every k in one vectorised
    step: a random-resized crop (``crop="random"``, ``draws`` N x 23 numbers) or Resize + CenterCrop."""
    w, h = np.atleast_1d(np.asarray(w, dtype=np.int64)), np.atleast_1d(np.asarray(h, dtype=np.int64))
    n = len(draws) if crop == "random" else max(len(w), len(h))
    w, h = np.broadcast_to(w, (n,)), np.broadcast_to(h, (n,))
    H, W = size
    src = np.stack([w, h], 1)
    if crop == "random":
        box, flip = random_boxes(w, h, draws)
        return Plans(box, src, np.broadcast_to(np.array([W, H], np.int64), (n, 2)), np.zeros((n, 2), np.int64),
                     flip, True)
    th, tw = resize_target(H, crop_ratio), resize_target(W, crop_ratio)
    tall = th * w >= tw * h  # the height binds
    rw = np.where(tall, np.maximum(1, (th * w / h).astype(np.int64)), tw)
    rh = np.where(tall, th, np.maximum(1, (tw * h / w).astype(np.int64)))
    offset = np.stack([np.rint((rw - W) / 2.0), np.rint((rh - H) / 2.0)], 1).astype(np.int64)
    box = np.concatenate([np.zeros((n, 2), np.int64), src], 1)
    return Plans(box, src, np.stack([rw, rh], 1), offset, np.zeros(n, bool), False)


def center_slices(h: int, w: int, size: Size) -> Tuple[slice, slice]:
    """CenterCrop(size) of an h x w array as (rows, cols) slices; size must fit."""
    top, left = center_offset(h, size[0]), center_offset(w, size[1])
    return slice(top, top + size[0]), slice(left, left + size[1])
