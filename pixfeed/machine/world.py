"""Which rank this process is and how many there are, detected at the edge.

``World.detect(distributed)`` is the only place pixfeed looks at
``torch.distributed`` or the environment.  Loaders call it when an epoch
starts (and for ``len``), not only when they are made, so a loader made before
``init_process_group`` splits once the process group exists:

* ``distributed=False``: a single process, always.
* ``distributed="auto"``: the initialised process group if there is one, else
  a single process.
* ``distributed=True``: the initialised process group, else ``RANK`` and
  ``WORLD_SIZE`` from the environment (set by ``torchrun``); neither is an error.

``wrapped=True`` asks for the world of an epoch that another library's
DataLoader drives around pixfeed's sampler or dataset.  Hugging Face
Accelerate's prepared loaders split batches by rank themselves, so while
Accelerate runs this process as one of several the answer is a single process
(pixfeed must not split a second time); otherwise it is the same as above.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Union

import torch.distributed as dist

from pixfeed.errors import OptionError

Distributed = Union[bool, str]


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @classmethod
    def detect(cls, distributed: Distributed = "auto", *, wrapped: bool = False) -> "World":
        if distributed not in (True, False, "auto"):
            raise OptionError(f"distributed must be True, False or 'auto', not {distributed!r}")
        if distributed is False or (wrapped and accelerate_splits()):
            return cls()
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        if distributed is True:
            return cls._from_environment()
        return cls()

    @classmethod
    def _from_environment(cls) -> "World":
        try:
            return cls(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
        except (KeyError, ValueError):
            raise OptionError(
                "distributed=True needs an initialised process group "
                "(torch.distributed.init_process_group) or integer RANK and WORLD_SIZE "
                "environment variables; use distributed='auto' to run as a single process"
            ) from None


def accelerate_splits() -> bool:
    """True while Hugging Face Accelerate runs this process as one of several (it is never imported here)."""
    state = sys.modules.get("accelerate.state")
    return state is not None and state.PartialState._shared_state.get("num_processes", 1) > 1

