"""Map-style reads with ``on_error="skip"``: a damaged record's place taken by the next sound one.

``SkipDamaged`` wraps what the DataLoader reads (the dataset, its ``BatchReader``
or ``SeededSamples``).  A batch is read as usual; only when that read fails on
a damaged record (``pixfeed.datasets.skips.DAMAGED``) is each index read alone,
and a damaged index ``i`` is replaced by the first sound one of ``i + 1, i + 2,
...`` (wrapping), then the batch is read again with the replacements.  So a
batch stays full, ``len(loader)`` and the epoch's length stay exact, and the
replacement is a function of the index alone: the same in every worker, epoch
and resume (it is read as itself, random crop included).  The cost is paid only
by a batch that holds a damaged record the first time this process meets it
(later, the replacement it found is read in the batch's one read).  Each skip is counted in the loader's
``SkipLog`` and named in a warning once per loader; after ``MAX_RUN`` damaged
records in a row the dataset is damaged beyond skipping, and the error is
raised.
"""
from __future__ import annotations

from typing import Any, Dict, List, Set

from torch.utils.data import Dataset

from pixfeed.datasets.skips import DAMAGED, SkipLog

MAX_RUN = 64  # damaged records in a row that end the skipping


class SkipDamaged(Dataset):
    """``source`` read with damaged records replaced; ``dataset`` is the caller's (for ``where``, resume)."""

    epoch_in_shared_memory = True

    def __init__(self, source: Any, dataset: Any, log: SkipLog) -> None:
        self.source, self.dataset, self.log = source, dataset, log
        self._bad: Set[int] = set()  # damaged indices this process has met
        self._instead: Dict[int, int] = {}  # damaged index -> the sound one read in its place

    def set_epoch(self, epoch: int) -> None:
        if callable(getattr(self.source, "set_epoch", None)):
            self.source.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        return self.source[self._sound(int(index))]

    def __getitems__(self, indices: List[int]) -> Any:
        indices = [int(i) for i in indices]
        try:  # one read, damaged records met before already replaced
            batch = self._read([self._instead.get(i, i) for i in indices])
        except DAMAGED:
            return self._read([self._sound(i) for i in indices])  # each record alone, to find the damaged
        for i in indices:
            if i in self._instead:
                self.log.record(None)  # named when this loader first met it
        return batch

    def _read(self, indices: List[int]) -> Any:
        getitems = getattr(self.source, "__getitems__", None)
        return getitems(indices) if callable(getitems) else [self.source[i] for i in indices]

    def _sound(self, index: int) -> int:
        """``index`` if its record reads, else the first of the records after it that does."""
        n = len(self.source)
        for step in range(min(n, MAX_RUN)):
            candidate = (index + step) % n
            if candidate not in self._bad:
                try:
                    self._read([candidate])
                except DAMAGED as error:
                    self._bad.add(candidate)
                    self.log.record(error, f"record {(candidate + 1) % n} or the next sound one is read in its "
                                    "place", counted=step == 0)
                    continue
                if step:
                    self._instead[index] = candidate
                return candidate
            if step == 0:
                self.log.record(None)  # named when this process first met it
        raise DAMAGED[0](f"on_error='skip': {min(n, MAX_RUN)} records in a row from record {index} are damaged; "
                         f"the dataset is damaged beyond skipping: run pixfeed verify on it")

