"""``make_loader``: pixfeed's DataLoader for a dataset, every "auto" option resolved.

The one entry point: ``num_workers="tune"`` goes to the tuner (``tune.py``), which measures
candidates built by ``loader.build_loader``; anything else is built directly.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Optional, Sequence

import torch

from pixfeed.errors import OptionError
from pixfeed.loaders.device import check_output, device_loader
from pixfeed.loaders.loader import PixfeedLoader, build_loader
from pixfeed.loaders.plan import Auto
from pixfeed.loaders.tune import tuned_loader


def make_loader(
    dataset: Any,
    batch_size: int,
    *,
    num_workers: Auto = "auto",
    device: Any = None,
    dtype: torch.dtype = torch.uint8,
    mean: Optional[Sequence[float]] = None,
    std: Optional[Sequence[float]] = None,
    memory_format: torch.memory_format = torch.channels_last,
    **options: Any,
) -> PixfeedLoader:
    """A DataLoader for ``dataset``; see ``loader.pixfeed_plan`` for what was chosen and why.

    ``options`` are ``build_loader``'s (its signature is part of this one's: ``help(make_loader)``):
    ``shuffle``, ``drop_last``, ``pin_memory``, ``persistent_workers``, ``prefetch_factor``,
    ``read_ahead``, ``seed``, ``distributed``, ``stall_timeout``, ``order``, ``io_ahead``, ``io_depth``,
    ``decode_threads``, ``training_threads``, ``sampler``, ``collate_fn`` and ``on_error``.

    ``memory_format`` (any ``device``, None included): a batch's images are N x C x H x W in
    channels_last strides by default (the stored HWC pixels in one copy, what convolutions on GPUs
    prefer), or plain NCHW with ``torch.contiguous_format``.  ``sampler`` and ``collate_fn`` are a
    caller's, passed through (the plan says what pixfeed then cannot guarantee; what it cannot honour is
    refused by name).  ``on_error="skip"`` reads on past damaged records, counted in
    ``loader.pixfeed_plan.skipped``; ``"raise"`` is the default.

    ``shuffle`` and ``seed`` (default True and 0) order a map-style dataset through the sampler.
    An iterable dataset orders its own samples: one with ``shuffle`` and ``seed`` attributes
    (pixfeed's WebDataset reader) is given the values passed here and otherwise keeps its own;
    any other iterable dataset refuses them.  ``order="quasi_random"`` shuffles chunks of
    consecutive records instead, for datasets larger than memory; the default ``"auto"`` is the full
    shuffle (``"random"``) except for a bucket dataset larger than its ``cache_limit``, read through
    chunks, which it reads quasi-randomly (the reason, with both orders' forecast bytes, in the plan);
    ``io_ahead`` is the bytes of records requested from storage ahead of the reader, ``io_depth`` the reads
    of them kept in flight (measured per device by default; 0: ``posix_fadvise(WILLNEED)``; ``cacheplan.py``).
    ``decode_threads`` decodes each batch's images on that many threads where they are read (by default all usable
    CPUs when there are no workers).  ``training_threads`` caps torch's threads in this process while
    batches are read, by default to the CPUs the workers leave (at least 1); None leaves them alone.

    ``num_workers="tune"`` measures candidate settings first (``pixfeed.loaders.tune``).

    ``device`` (None: batches stay on the CPU, as read): ``"cuda"``, ``"cuda:N"``, a ``torch.device`` or
    ``"cpu"``: batches come out there, images as ``dtype`` (uint8, or float32/bfloat16/float16 normalised
    by ``mean``/``std``, ImageNet's by default) in ``memory_format``; encoded images decode on the GPU and
    stored pixels are cropped there where that pays (``pixfeed.loaders.device``; the plan's ``decode_on``)."""
    if isinstance(dataset, (str, bytes, os.PathLike)):  # a str is a sequence too: of characters
        path = os.fsdecode(dataset)
        raise OptionError(f"make_loader({path!r}, ...): give a dataset, not its path; open it first: "
                          f"make_loader(pixfeed.open_dataset({path!r}), {batch_size!r})")
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"make_loader() got an unexpected keyword argument {unknown[0]!r}")
    check_output(device, dtype, mean, std, memory_format)
    if device is not None:
        for name in ("collate_fn", "on_error"):
            if options.get(name) not in (None, "raise"):
                raise OptionError(f"{name} and device: with device= batches are made on the device, not collated from "
                                  f"CPU samples; apply it to the batches in the training loop, or leave device out")
        return device_loader(dataset, batch_size, device=device, dtype=dtype, mean=mean, std=std,
                             memory_format=memory_format, num_workers=num_workers, **options)
    if num_workers == "tune":
        return tuned_loader(dataset, batch_size, memory_format=memory_format, **options)
    return build_loader(dataset, batch_size, num_workers=num_workers, memory_format=memory_format, **options)


def _signature() -> inspect.Signature:
    """make_loader's own parameters with build_loader's keyword options in place of ``**options``."""
    own = list(inspect.signature(make_loader).parameters.values())[:-1]
    return inspect.signature(make_loader).replace(parameters=own + list(_OPTIONS.values()))


_OWN = set(inspect.signature(make_loader).parameters)
_OPTIONS = {name: p for name, p in inspect.signature(build_loader).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and name not in _OWN}
make_loader.__signature__ = _signature()
