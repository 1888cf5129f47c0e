"""Collating pixfeed samples without torch.stack's transposing copy.

pixfeed images are uint8 CHW views of HWC pixel arrays (``permute(2, 0, 1)``
of a NumPy-backed tensor).  ``default_collate`` stacks them into a contiguous
N x C x H x W tensor, a strided transpose that costs ~15 ms for 64 images of
224x224 here.  ``collate`` stacks the underlying HWC arrays instead (a plain
copy, ~1 ms) and returns the batch as N x C x H x W in channels_last strides:
the same shape, and the layout ``get_batch`` returns and convolutions on GPUs
prefer.  Other C x H x W tensors (a ``transform``'s, a user's dataset's) are
stacked straight into that layout too, one transposing copy instead of
``default_collate``'s copy and a second one.  Anything else goes to
``default_collate`` unchanged.  With
``make_loader(memory_format=torch.contiguous_format)`` the CHW views are
stacked instead (the transposing copy, once, in the worker that collates), and
a whole batch's 4-D tensors are copied to that layout (``in_format``).

``Collate`` is the loader's ``collate_fn``: ``collate``, or the batch as
``get_batch`` read it, with the images made NCHW-contiguous while Hugging Face
Accelerate runs several processes.  Its ``dispatch_batches`` mode (the default
for iterable datasets) broadcasts each batch from rank 0 into contiguous
tensors, and torch.distributed copies raw memory whatever the strides
(pytorch/pytorch#62283): channels_last images would arrive scrambled on every
other rank.  Pickled for spawned workers, it carries the parent's answer, which
a fresh process cannot see.

A caller's ``collate_fn`` (``Collate.user``) gets the samples, as torch's
would: a whole batch is handed over as its samples' views (``as_samples``).

Samples with fields (``fields=`` of a pixfeed dataset: tuples or dicts) are
collated per field by ``collate_fields``: tensors of one shape are stacked
(images as above), ints, floats and bools become tensors, and everything else
(str, JSON values, bytes, tensors of differing shapes such as boxes) a list.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from pixfeed.fields.codec import column
from pixfeed.image import buffers as batchbuffers
from pixfeed.machine.world import accelerate_splits

CHANNELS_LAST = torch.channels_last


def _hwc_view(x: Any) -> bool:
    return (isinstance(x, torch.Tensor) and x.dim() == 3 and x.dtype == torch.uint8
            and x.permute(1, 2, 0).is_contiguous())


def _image(x: Any) -> bool:
    """A C x H x W tensor ``torch.stack`` can write into a batch of any layout (not one that needs grad)."""
    return isinstance(x, torch.Tensor) and x.dim() == 3 and x.device.type == "cpu" and not x.requires_grad


_NUMPY = {torch.uint8: np.uint8, torch.float32: np.float32, torch.float16: np.float16, torch.float64: np.float64}


def _stack(images: List[torch.Tensor], memory_format: torch.memory_format = CHANNELS_LAST) -> torch.Tensor:
    """One copy of the images into an N x C x H x W batch laid out in ``memory_format``: a plain copy where
    their strides already are (pixfeed's HWC views into channels_last), else the transposing one, made once
    here; in a worker into shared memory (as ``default_collate``), in this process into a recycled array."""
    first, n = images[0], len(images)
    c, h, w = first.shape
    shape = (n, h, w, c) if memory_format == CHANNELS_LAST else (n, c, h, w)
    if get_worker_info() is not None:
        out = first.new(first.untyped_storage()._new_shared(n * first.numel() * first.element_size()))
        out = out.resize_(*shape)
    elif first.dtype in _NUMPY:
        out = torch.from_numpy(batchbuffers.empty(shape, _NUMPY[first.dtype]))
    else:
        out = first.new_empty(shape)
    return torch.stack(images, out=out.permute(0, 3, 1, 2) if memory_format == CHANNELS_LAST else out)


def collate(batch: Sequence[Any], memory_format: torch.memory_format = CHANNELS_LAST) -> Any:
    """``default_collate``, with the images of (image, label) samples stacked straight into ``memory_format``."""
    first = batch[0]
    if isinstance(first, (tuple, list)) and len(first) == 2 and _image(first[0]):
        images = [sample[0] for sample in batch]
        if all(_image(x) and x.shape == first[0].shape and x.dtype == first[0].dtype for x in images):
            return [_stack(images, memory_format), default_collate([sample[1] for sample in batch])]
    return default_collate(batch)


def collate_fields(batch: Sequence[Any], memory_format: torch.memory_format = CHANNELS_LAST) -> Any:
    """A batch of field tuples or dicts, collated field by field (see the module's docstring)."""
    first = batch[0]
    if isinstance(first, dict):
        return {k: _column([sample[k] for sample in batch], memory_format) for k in first}
    return [_column([sample[j] for sample in batch], memory_format) for j in range(len(first))]


def _column(values: List[Any], memory_format: torch.memory_format) -> Any:
    """``fields.codec.column``, with HWC-backed images of one shape stacked as ``collate`` stacks them."""
    if all(_hwc_view(v) and v.shape == values[0].shape for v in values):
        return _stack(values, memory_format)
    return column(values)


def _share(batch: Any) -> None:
    """Move a worker's batch into shared memory here, as ``default_collate`` builds it there: a full
    ``/dev/shm`` then fails this call and reaches the training process as an error.  Left to the queue's
    sending thread, the failure was only printed and the batch never arrived (the loader waited forever)."""
    for tensor in batch if isinstance(batch, (tuple, list)) else (batch,):
        if isinstance(tensor, torch.Tensor):
            tensor.share_memory_()


class Collate:
    """``collate_fn``: ``collate`` (``whole_batches``: the batch as read) with the batch's 4-D tensors in
    ``memory_format`` (contiguous under Accelerate), or a user's ``collate_fn`` (``user``), which gets a list
    of samples as torch's would, whole batches given back as their samples' views."""

    def __init__(self, whole_batches: bool, contiguous: Optional[bool] = None, fields: bool = False,
                 memory_format: torch.memory_format = CHANNELS_LAST, user: Optional[Callable] = None) -> None:
        self.whole_batches, self.contiguous, self.fields = whole_batches, contiguous, fields
        self.memory_format, self.user = memory_format, user

    def __reduce__(self) -> Any:
        return Collate, (self.whole_batches, accelerate_splits(), self.fields, self.memory_format, self.user)

    def __call__(self, batch: Any) -> Any:
        if self.user is not None:
            return self.user(as_samples(batch) if self.whole_batches else batch)
        contiguous = accelerate_splits() if self.contiguous is None else self.contiguous
        fmt = torch.contiguous_format if contiguous else self.memory_format
        out = batch if self.whole_batches else collate_fields(batch, fmt) if self.fields else collate(batch, fmt)
        shared = get_worker_info() is not None
        out = in_format(out, fmt, shared)
        if self.whole_batches and shared:
            _share(out)
        return out


def in_format(batch: Any, memory_format: torch.memory_format, shared: bool = False) -> Any:
    """``batch`` (a tensor, or a tuple, list or dict of them) with its 4-D tensors in ``memory_format``:
    one copy each that is not (into shared memory when ``shared``: a worker's batch), none for the rest."""
    if isinstance(batch, torch.Tensor):
        return _to_format(batch, memory_format, shared) if batch.dim() == 4 else batch
    if isinstance(batch, dict):
        return {k: in_format(v, memory_format, shared) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    if isinstance(batch, (tuple, list)) and any(isinstance(v, torch.Tensor) and v.dim() == 4 for v in batch):
        return type(batch)(in_format(v, memory_format, shared) if isinstance(v, torch.Tensor) else v for v in batch)
    return batch


def _to_format(tensor: torch.Tensor, memory_format: torch.memory_format, shared: bool) -> torch.Tensor:
    """``tensor`` copied into ``memory_format``: in a worker into shared memory, in this process into a
    recycled batch array (``image.buffers``: a fresh 9.6 MB one per batch costs its page faults); the copy
    in NumPy on one thread, where torch's runs on its OpenMP threads, whose barriers wait for CPUs a busy
    machine gives to others (``benchmarks/loader_paths.py``)."""
    if tensor.is_contiguous(memory_format=memory_format):
        return tensor
    n, c, h, w = tensor.shape
    last = memory_format == CHANNELS_LAST
    numpy = tensor.dtype != torch.bfloat16 and not tensor.requires_grad and tensor.device.type == "cpu"
    if shared:
        out = tensor.new(tensor.untyped_storage()._new_shared(tensor.numel() * tensor.element_size()))
        out = out.resize_(n, h, w, c) if last else out.resize_(n, c, h, w)
    elif numpy:
        out = torch.from_numpy(batchbuffers.empty((n, h, w, c) if last else (n, c, h, w), tensor.numpy().dtype))
    else:
        return tensor.contiguous(memory_format=memory_format)
    out = out.permute(0, 3, 1, 2) if last else out
    if not numpy:
        return out.copy_(tensor)
    np.copyto(out.numpy(), tensor.numpy())
    return out


def as_samples(batch: Any) -> List[Any]:
    """A whole batch (columns: a tuple or list of them, or a dict) as the list of its samples, each a
    tuple (or dict) of views into it: what a user's ``collate_fn`` takes."""
    if isinstance(batch, dict):
        return [{k: v[i] for k, v in batch.items()} for i in range(batch_images(batch))]
    return [tuple(column[i] for column in batch) for i in range(batch_images(batch))]


def batch_images(batch: Any) -> int:
    """Images in a batch: the length of its first element (the images of an (images, labels) pair)."""
    first = next(iter(batch.values())) if isinstance(batch, dict) and batch else \
        batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    return len(first) if hasattr(first, "__len__") else 1
