"""How many bytes one sample takes, learnt without reading a sample in this process.

``make_loader`` needs the size of a batch to fit the batches in flight into
``/dev/shm`` (``shm.py``) and to size ``prefetch_factor`` (``plan.py``):

1. from the dataset's metadata when it declares ``fixed_shape`` (every pixfeed
   dataset opened with ``size=`` or storing pixels): uint8 pixels plus an
   int64 label;
2. else, only when there will be worker processes, by reading sample 0 in a
   throwaway process of the kind the workers will be (torch's default
   multiprocessing context), which reports the byte count and exits.

Reading sample 0 in the training process itself would open the handles of a
dataset that opens LMDB environments, HDF5 files or sockets lazily, before the
workers fork, and every worker would then share them: the bug lazy opening
exists to avoid.  If the throwaway process fails or takes longer than
``PROBE_TIMEOUT_S``, the size is unknown and the plan says so (the loader
then surfaces the dataset's own error, from a worker).
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import IterableDataset

PROBE_TIMEOUT_S = 60


def sample_bytes(dataset: Any, workers: int) -> Optional[int]:
    """Bytes of one sample: from ``fixed_shape`` (uint8) when known, else probed if there are workers."""
    shape = getattr(dataset, "fixed_shape", None)
    if shape is not None:
        return math.prod(shape) + 8
    if not workers or isinstance(dataset, IterableDataset) or len(dataset) == 0:
        return None
    return _probe(dataset)


def _probe(dataset: Any) -> Optional[int]:
    context = torch.multiprocessing.get_context()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_report, args=(dataset, send), name="pixfeed-sample-probe", daemon=True)
    process.start()
    send.close()
    try:
        return receive.recv() if receive.poll(PROBE_TIMEOUT_S) else None
    except EOFError:  # the process died before it could report
        return None
    finally:
        receive.close()
        if process.is_alive():
            process.kill()
        process.join()


def _report(dataset: Any, send: Any) -> None:
    try:
        size: Optional[int] = _nbytes(dataset[0])
    except Exception:  # the loader's workers will raise it where the training loop sees it
        size = None
    send.send(size)


def _nbytes(value: Any) -> int:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return int(value.nbytes)
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(item) for item in value)
    if isinstance(value, dict):
        return sum(_nbytes(item) for item in value.values())
    return 8
