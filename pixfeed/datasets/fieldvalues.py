"""Turning a record's stored image and field bytes into what a reader returns, geometry shared.

When a reader returns fields that follow the image (mask, image, boxes) and
resizes (``size=``), one plan (``pixfeed.image.geometry.Plan``) is drawn per sample,
with the same random draws the image alone would take, and applied to all of
them: the image through its decode path, masks with nearest neighbour, boxes
mapped and clipped, with the boxes a crop leaves empty dropped together with
the rows of the ``per_box`` fields.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from ..image import geometry
from ..image.decode import apply_plan, decode, oriented_size
from ..errors import CorruptDataError, Location
from ..fields import codec, picture
from ..fields.array import transform
from ..image.geometry import Plan
from ..seeds import Draws, batch_draws, crop_draws


def sample_rng(i: int) -> Draws:
    """Record ``i``'s numbers for a random crop (``seeds.Draws``): from (seed, epoch, i) when the loader seeds
    by index (``seeds.seeded_by_index``), else keyed from torch's RNG, so DataLoader worker seeding governs it."""
    return Draws(crop_draws([i])[0])


def sample_rngs(indices) -> list:
    """``sample_rng`` of each of a batch's ``indices``, drawn in one vectorised step."""
    return batch_draws(indices)


class FieldValues:
    """Mixed into ImageRecords: ``assemble`` a record's output from its stored bytes."""

    def needs_image(self) -> bool:
        """Whether the stored image must be read: returned, or needed for an encoded record's plan."""
        names = self.fields or ("image",)
        return "image" in names or (self.store == "encoded" and self.size is not None and bool(self._geometric()))

    def _geometric(self) -> list:
        names = self.fields or [f.name for f in self.schema]
        return [f for f in self.schema if f.geometric and f.name in names]

    def plan_for(self, stored, i: int) -> Optional[Plan]:
        """The sample's geometry (drawing a random crop's numbers), or None when nothing is resized."""
        if self.size is None or not self._geometric():
            return None
        rng = sample_rng(i) if self.crop == "random" else None
        if self.store == "encoded":
            w, h = oriented_size(bytes(stored), Location(self.where, i))
            return geometry.plan(w, h, self.size, "crop", self.crop, rng, self.crop_ratio)
        h, w = self.stored_shape[:2]
        if self.crop == "random":
            return geometry.plan(w, h, self.size, crop="random", rng=rng)
        crop = self._slice_crop()
        if crop is None:
            return geometry.plan(w, h, self.size, "crop")
        rows, cols = crop
        return Plan(None, (w, h), (w, h), (cols.start, rows.start))

    def image_pixels(self, stored, i: int, plan: Optional[Plan]) -> np.ndarray:
        if plan is None:
            return self.pixels(stored, i)
        if self.store == "encoded":
            return decode(bytes(stored), size=self.size, plan=plan, where=Location(self.where, i), exact=self.exact)
        from PIL import Image
        return np.asarray(apply_plan(Image.fromarray(np.asarray(stored)), plan, self.size))

    def check_field(self, name: str, data, expected: int, i: int) -> None:
        from ..checksum import record_hash

        if self.checksums and record_hash(data) != int(expected):
            raise CorruptDataError(f"{self.where(i)}: field {name}'s stored bytes fail their xxh3_64 checksum "
                                   f"(damaged data); run 'pixfeed verify {self.path}'")

    def assemble(self, stored, label, raw: Dict[str, bytes], i: int):
        """The tuple (``fields=`` names, in order) or dict (``fields=None``) of one record."""
        names = self.fields or ("image", "label", *(f.name for f in self.schema))
        plan = self.plan_for(stored, i)
        out = {}
        for f in self.schema:
            if f.name in raw:
                out[f.name] = self._value(f, raw[f.name], plan)
        self._drop_boxes(out, plan)
        if "image" in names:
            img = self.image_pixels(stored, i, plan)
            tensor = torch.from_numpy(img if img.flags.writeable else img.copy()).permute(2, 0, 1)
            out["image"] = self.transform(tensor) if self.transform is not None else tensor
        out["label"] = int(label)
        return {n: out[n] for n in names} if self.fields is None else tuple(out[n] for n in names)

    def _value(self, f, data, plan: Optional[Plan]):
        if f.type == "mask":
            arr = picture.load_mask(bytes(data), "mask") if self.store == "encoded" else \
                np.frombuffer(data, np.uint8).reshape(self.stored_shape[:2])
            return torch.from_numpy(np.array(picture.mask_pixels(arr, plan, self.size) if plan else arr))
        if f.type == "image":
            if self.store == "encoded":
                arr = decode(bytes(data), size=self.size if plan else None, plan=plan, exact=self.exact)
            else:
                arr = np.frombuffer(data, np.uint8).reshape(self.stored_shape)
                if plan is not None:
                    from PIL import Image
                    arr = np.asarray(apply_plan(Image.fromarray(arr), plan, self.size))
            return torch.from_numpy(np.array(arr)).permute(2, 0, 1)
        value = codec.decode(f, data)
        if f.type == "boxes" and plan is not None:
            boxes, keep = transform(value.numpy(), plan, self.size)
            return torch.from_numpy(boxes), torch.from_numpy(keep)
        return value

    def _drop_boxes(self, out: dict, plan: Optional[Plan]) -> None:
        """Unpack mapped boxes; drop the per-box rows of boxes a crop left empty."""
        for f in self.schema:
            if f.type == "boxes" and isinstance(out.get(f.name), tuple):
                out[f.name], keep = out[f.name]
                for name in self.per_box:
                    if name in out:
                        out[name] = out[name][keep]
