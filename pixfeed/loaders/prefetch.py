"""``DevicePrefetcher``: overlap the host-to-device copy of batch ``i+1`` with step ``i``.

Batches are ``(images, *rest)`` sequences, ``images`` uint8 ``N x C x H x W``
(any memory format, channels_last is kept); other float images are only cast.  On CUDA, the next batch is copied
on a side stream with ``non_blocking=True`` (truly asynchronous when the loader
pins memory, which ``make_loader`` does whenever CUDA is available) and the
images are converted to ``dtype`` and normalised there, so the bus carries
uint8: a quarter of the bytes of a float32 batch.  The training stream waits
for the side stream before it sees a batch, and ``record_stream`` keeps the
caching allocator from reusing the memory too early.

With a CPU ``device`` batches pass through with the same conversion on the CPU, so
training code is the same everywhere.  A CUDA ``device`` where torch cannot use it (a
CPU-only build, no device visible, an index past the last device) raises ``OptionError``
naming CUDA when the prefetcher is made, as ``tensor.to("cuda")`` would: batches never
silently stay on the CPU.

``mean`` and ``std`` are per channel, on the 0..1 scale (torchvision's
``(0.485, 0.456, 0.406)``); without them images are scaled to 0..1.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional, Sequence, Tuple

import torch

from pixfeed.errors import OptionError


class DevicePrefetcher:
    def __init__(self, loader: Iterable[Sequence[Any]], device: Any, mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None, dtype: torch.dtype = torch.float32) -> None:
        if (mean is None) != (std is None):
            raise OptionError("mean and std go together: give both or neither")
        self.loader = loader
        self.device = _usable(torch.device(device))
        self.dtype = dtype
        self.mean = _per_channel(mean, self.device, dtype, "mean")
        self.std = _per_channel(std, self.device, dtype, "std")
        if self.std is not None and bool((self.std == 0).any()):
            raise OptionError(f"std must not contain 0, got {list(std or [])}")

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        if self.device.type == "cuda":
            return self._overlapped()
        return (self._convert(batch) for batch in self.loader)

    def _convert(self, batch: Sequence[Any]) -> Tuple[Any, ...]:
        images, *rest = [_to(item, self.device) for item in batch]
        images, source = images.to(self.dtype, copy=True), images
        if source.dtype == torch.uint8:
            images.div_(255)
        if self.mean is not None:
            images.sub_(self.mean).div_(self.std)
        return (images, *rest)

    def _overlapped(self) -> Iterator[Tuple[Any, ...]]:
        stream = torch.cuda.Stream(self.device)
        batches = iter(self.loader)
        upcoming = self._send(next(batches, None), stream)
        while upcoming is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)
            current = upcoming
            for item in current:
                if isinstance(item, torch.Tensor):
                    item.record_stream(torch.cuda.current_stream(self.device))
            upcoming = self._send(next(batches, None), stream)
            yield current

    def _send(self, batch: Optional[Sequence[Any]], stream: "torch.cuda.Stream") -> Optional[Tuple[Any, ...]]:
        if batch is None:
            return None
        with torch.cuda.stream(stream):
            return self._convert(batch)


def _usable(device: torch.device) -> torch.device:
    """``device``, or OptionError naming CUDA when it is a CUDA device torch cannot use here."""
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        why = (f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None
               else f"torch (CUDA {torch.version.cuda}) sees no CUDA device: check the driver and CUDA_VISIBLE_DEVICES")
        raise OptionError(f"DevicePrefetcher(loader, {str(device)!r}): CUDA is not available: {why}; "
                          "pass device='cpu' to convert batches on the CPU")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise OptionError(f"DevicePrefetcher(loader, {str(device)!r}): no such CUDA device; this machine has "
                          f"{count} (cuda:0 to cuda:{count - 1})")
    return device


def _to(item: Any, device: torch.device) -> Any:
    return item.to(device, non_blocking=True) if isinstance(item, torch.Tensor) else item


def _per_channel(values: Optional[Sequence[float]], device: torch.device, dtype: torch.dtype,
                 name: str) -> Optional[torch.Tensor]:
    if values is None:
        return None
    tensor = torch.as_tensor(values, dtype=dtype, device=device)
    if tensor.ndim != 1:
        raise OptionError(f"{name} must be one value per channel, got {values!r}")
    return tensor.view(1, -1, 1, 1)

