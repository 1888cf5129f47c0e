"""Read-ahead in the order the loader already knows: ``Hinter``.

The sampler fixes an epoch's order before the epoch starts, so while batch
``k`` is read, the kernel can already be reading the records of the batches
after it.  ``Hinter.follow(indices)`` yields the sampler's indices one by one
and keeps the records of the next ``budget`` bytes of that order requested
from storage (``posix_fadvise(WILLNEED)`` on their byte ranges, which returns
without waiting): when less than half the budget is left ahead of the index
being handed out, it requests the next half at once, in file order with
touching ranges merged, so a quasi-random order's runs of consecutive records
become long sequential reads.  Small files read for every record (labels,
checksums) are requested whole at the start of each epoch.

It runs where the sampler runs, the training process, and serves readers in
the same process and in workers alike: the page cache is shared.  The indices
handed out are the ones the DataLoader sends to readers, at most
``prefetch_factor`` batches per worker ahead of the training loop, so the
pages requested ahead of the training loop stay under ``budget`` plus the
batches in flight.  It needs the byte ranges of records (``record_extents()``:
pixfeed's mmap, LMDB and HDF5 readers); other datasets are read without it.
"""
from __future__ import annotations

import os
from typing import Iterator, List

import numpy as np

from pixfeed.pagecache import Extents, will_need


class Hinter:
    """Requests the next ``budget`` bytes of records in the order given to ``follow``."""

    def __init__(self, extents: Extents, budget: int) -> None:
        self.extents, self.budget = extents, budget

    def follow(self, indices: List[int]) -> Iterator[int]:
        idx = np.asarray(indices, dtype=np.int64)
        starts, lengths = self.extents.starts[idx], self.extents.lengths[idx]
        ends = np.cumsum(lengths)
        self._whole()
        fd = os.open(self.extents.path, os.O_RDONLY)
        try:
            hinted = 0
            for pos, index in enumerate(indices):
                done = int(ends[pos - 1]) if pos else 0
                if hinted <= pos or ends[hinted - 1] - done < self.budget // 2:
                    stop = max(int(np.searchsorted(ends, done + self.budget, "right")), pos + 1)
                    will_need(fd, starts[hinted:stop], lengths[hinted:stop])
                    hinted = stop
                yield index
        finally:
            os.close(fd)

    def _whole(self) -> None:
        for path in self.extents.whole:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
