"""Which rank this process is and how many there are, detected once, at the edge.

``World.detect(distributed)`` is the only place ``make_loader`` looks at
``torch.distributed`` or the environment:

* ``distributed=False``: a single process, always.
* ``distributed="auto"``: the initialised process group if there is one, else
  a single process, with a warning when ``WORLD_SIZE`` says this is one of
  several ranks (a loader made before ``init_process_group`` would read the
  whole dataset on every rank).
* ``distributed=True``: the initialised process group, else ``RANK`` and
  ``WORLD_SIZE`` from the environment (set by ``torchrun``); neither is an error.
"""
from __future__ import annotations

import os
import warnings
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
    def detect(cls, distributed: Distributed = "auto") -> "World":
        if distributed not in (True, False, "auto"):
            raise OptionError(f"distributed must be True, False or 'auto', not {distributed!r}")
        if distributed is False:
            return cls()
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        if distributed is True:
            return cls._from_environment()
        size = os.environ.get("WORLD_SIZE", "1")
        if size.isdigit() and int(size) > 1:
            warnings.warn(f"WORLD_SIZE={size} in the environment, but no torch.distributed process group is "
                          "initialised: this loader reads the whole dataset in this process. Create it after "
                          "init_process_group, or pass distributed=True to split by RANK and WORLD_SIZE",
                          stacklevel=3)
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
