"""Collating pixfeed samples without torch.stack's transposing copy.

pixfeed images are uint8 CHW views of HWC pixel arrays (``permute(2, 0, 1)``
of a NumPy-backed tensor).  ``default_collate`` stacks them into a contiguous
N x C x H x W tensor, a strided transpose that costs ~15 ms for 64 images of
224x224 here.  ``collate`` stacks the underlying HWC arrays instead (a plain
copy, ~1 ms) and returns the batch as N x C x H x W in channels_last strides:
the same shape, and the layout ``get_batch`` returns and convolutions on GPUs
prefer.  Anything else goes to ``default_collate`` unchanged.

``Collate`` is the loader's ``collate_fn``: ``collate``, or the batch as
``get_batch`` read it, with the images made NCHW-contiguous while Hugging Face
Accelerate runs several processes.  Its ``dispatch_batches`` mode (the default
for iterable datasets) broadcasts each batch from rank 0 into contiguous
tensors, and torch.distributed copies raw memory whatever the strides
(pytorch/pytorch#62283): channels_last images would arrive scrambled on every
other rank.  Pickled for spawned workers, it carries the parent's answer, which
a fresh process cannot see.

Samples with fields (``fields=`` of a pixfeed dataset: tuples or dicts) are
collated per field by ``collate_fields``: tensors of one shape are stacked
(images as above), ints, floats and bools become tensors, and everything else
(str, JSON values, bytes, tensors of differing shapes such as boxes) a list.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch
from torch.utils.data import default_collate, get_worker_info

from pixfeed.fields.codec import column
from pixfeed.machine.world import accelerate_splits


def _hwc_view(x: Any) -> bool:
    return (isinstance(x, torch.Tensor) and x.dim() == 3 and x.dtype == torch.uint8
            and x.permute(1, 2, 0).is_contiguous())


def _stack_hwc(images: List[torch.Tensor]) -> torch.Tensor:
    first = images[0].permute(1, 2, 0)
    out = None
    if get_worker_info() is not None:  # as default_collate: build the batch in shared memory
        storage = first.untyped_storage()._new_shared(len(images) * first.numel())
        out = first.new(storage).resize_(len(images), *first.shape)
    return torch.stack([x.permute(1, 2, 0) for x in images], out=out).permute(0, 3, 1, 2)


def collate(batch: Sequence[Any]) -> Any:
    """``default_collate``, with (image, label) samples of HWC-backed images stacked fast."""
    first = batch[0]
    if isinstance(first, (tuple, list)) and len(first) == 2 and _hwc_view(first[0]):
        images = [sample[0] for sample in batch]
        if all(_hwc_view(x) and x.shape == images[0].shape for x in images):
            return [_stack_hwc(images), default_collate([sample[1] for sample in batch])]
    return default_collate(batch)


def collate_fields(batch: Sequence[Any]) -> Any:
    """A batch of field tuples or dicts, collated field by field (see the module's docstring)."""
    first = batch[0]
    if isinstance(first, dict):
        return {k: _column([sample[k] for sample in batch]) for k in first}
    return [_column([sample[j] for sample in batch]) for j in range(len(first))]


def _column(values: List[Any]) -> Any:
    """``fields.codec.column``, with HWC-backed images of one shape stacked as ``collate`` stacks them."""
    if all(_hwc_view(v) and v.shape == values[0].shape for v in values):
        return _stack_hwc(values)
    return column(values)


def _share(batch: Any) -> None:
    """Move a worker's batch into shared memory here, as ``default_collate`` builds it there: a full
    ``/dev/shm`` then fails this call and reaches the training process as an error.  Left to the queue's
    sending thread, the failure was only printed and the batch never arrived (the loader waited forever)."""
    for tensor in batch if isinstance(batch, (tuple, list)) else (batch,):
        if isinstance(tensor, torch.Tensor):
            tensor.share_memory_()


class Collate:
    """``collate_fn``: ``collate`` (``whole_batches``: the batch as read), contiguous images under Accelerate."""

    def __init__(self, whole_batches: bool, contiguous: Optional[bool] = None, fields: bool = False) -> None:
        self.whole_batches, self.contiguous, self.fields = whole_batches, contiguous, fields

    def __reduce__(self) -> Any:
        return Collate, (self.whole_batches, accelerate_splits(), self.fields)

    def __call__(self, batch: Any) -> Any:
        out = batch if self.whole_batches else collate_fields(batch) if self.fields else collate(batch)
        if self.whole_batches and get_worker_info() is not None:
            _share(out)
        contiguous = accelerate_splits() if self.contiguous is None else self.contiguous
        if contiguous and isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
            out = type(out)([out[0].contiguous(), *out[1:]])
        return out


def batch_images(batch: Any) -> int:
    """Images in a batch: the length of its first element (the images of an (images, labels) pair)."""
    first = next(iter(batch.values())) if isinstance(batch, dict) and batch else \
        batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    return len(first) if hasattr(first, "__len__") else 1
