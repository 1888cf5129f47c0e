"""An independent reference for tests: pixfeed's documented decode rules and
torchvision's transforms, written from torchvision's published formulas
(``transforms.functional.resize`` / ``_compute_resized_output_size``,
``center_crop``, ``RandomResizedCrop.get_params``) on Pillow images, without
importing anything from pixfeed."""
from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageOps


def reference_rgb(path) -> Image.Image:
    img = Image.open(path)
    img.load()
    img = ImageOps.exif_transpose(img)
    if img.mode.startswith("I;16") or img.mode == "I":
        img = Image.fromarray((np.asarray(img).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8), "L")
    return img.convert("RGB")


def resize_shape(width: int, height: int, size: int):
    """(W, H) of torchvision's Resize(size) (an int: the shorter edge)."""
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def tv_resize(img: Image.Image, size: int) -> Image.Image:
    """torchvision Resize(size) on a PIL image, bilinear."""
    shape = resize_shape(*img.size, size)
    return img if shape == img.size else img.resize(shape, Image.BILINEAR)


def center_crop_box(width: int, height: int, crop_h: int, crop_w: int):
    """(left, top, right, bottom) of torchvision's center_crop (crop within the image)."""
    top = int(round((height - crop_h) / 2.0))
    left = int(round((width - crop_w) / 2.0))
    return left, top, left + crop_w, top + crop_h


def tv_center_crop(img: Image.Image, crop_h: int, crop_w: int) -> Image.Image:
    return img.crop(center_crop_box(*img.size, crop_h, crop_w))


def rrc_params(width: int, height: int, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """RandomResizedCrop.get_params -> (top, left, h, w), its draws taken from a NumPy
    generator in torchvision's order (area, log-aspect, then top, then left)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def tv_random_resized_crop_flip(img: Image.Image, out_h: int, out_w: int, rng) -> Image.Image:
    """RandomResizedCrop((out_h, out_w)) then RandomHorizontalFlip, one rng for both."""
    i, j, h, w = rrc_params(*img.size, rng)
    img = img.crop((j, i, j + w, i + h)).resize((out_w, out_h), Image.BILINEAR)
    return img.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else img


def reference_pixels(path, size: int, resize_to: int = None) -> np.ndarray:
    """Resize(resize_to or size) + CenterCrop(size), as torchvision on a PIL image."""
    img = tv_resize(reference_rgb(path), resize_to or size)
    return np.asarray(tv_center_crop(img, size, size))
