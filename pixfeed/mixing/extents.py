"""Where a mixture's samples lie in its sources' files, for read-ahead in the mixture's order.

The loader's read-ahead (``pixfeed.loaders.readahead.Hinter``) follows the sampler's order of the
mixture's indices and asks ``Extents.of(indices)`` for the byte ranges of the next window of it.  A
mixture has one file per source, so ``MixtureExtents`` holds one ``SourceExtents`` per local source
that gives record byte ranges (``parts``): ``of(indices)`` of part ``s`` maps the window through
``Mixture.locate`` (global index -> source, record, for the current epoch) and returns source ``s``'s
records' ranges in its file, length 0 at the other sources' indices (requested as nothing), so the
hinter keeps each source's file requested for the records of the next window of the global order.
Nothing per record is kept beyond the sampler's order: a window is located when it is requested.
A source read through a bucket's chunk cache is fetched ahead instead, by a ``Fetcher`` of its chunks
given the same kind of view (``chunked_parts``: the loader's ``fetchplan`` runs one per such source
beside the read-ahead), and a source without record byte ranges is read without hints.
"""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np


class SourceExtents:
    """Source ``s``'s records among a mixture's indices: ``of(indices)`` gives their (starts, lengths) in its
    file, (0, 0) at another source's index.  ``mean_length`` is bytes per mixture index (the source's mean
    record times its share of an epoch), so a budget split by it covers about as many positions per source."""

    def __init__(self, mixture: Any, source: int, inner: Any) -> None:
        self.mixture, self.source, self.inner = mixture, source, inner
        self.path, self.whole, self.count, self.lookups = inner.path, inner.whole, len(mixture), 1
        self.mean_length = inner.mean_length * mixture.quotas[source] / max(len(mixture), 1)

    def of(self, indices: np.ndarray) -> tuple:
        source, records, _ = self.mixture.locate(indices)
        starts, lengths = np.zeros(len(source), np.int64), np.zeros(len(source), np.int64)
        mine = source == self.source
        if mine.any():
            starts[mine], lengths[mine] = self.inner.of(records[mine])
        return starts, lengths


class MixtureExtents:
    """The read-ahead's view of a mixture: ``parts`` (one ``SourceExtents`` per source file it can hint),
    ``count`` mixture indices and ``mean_length`` bytes per index (what sizes the budget and the
    quasi-random chunks); ``path`` and ``whole`` are the first part's."""

    def __init__(self, mixture: Any, parts: List[SourceExtents]) -> None:
        self.parts, self.count = parts, len(mixture)
        self.mean_length = sum(p.mean_length for p in parts)
        self.path, self.whole = parts[0].path, [w for p in parts for w in p.whole]

    def of(self, indices: np.ndarray) -> tuple:
        """(starts, lengths) of ``indices`` in their own sources' files (for tools that add lengths up)."""
        pairs = [p.of(indices) for p in self.parts]
        return sum(s for s, _ in pairs), sum(n for _, n in pairs)


def mixture_extents(mixture: Any) -> Optional[MixtureExtents]:
    """A mixture's ``MixtureExtents``, or None when no local source gives record byte ranges."""
    parts = []
    for s, ds in enumerate(mixture.sources):
        if getattr(ds, "chunks", None) is not None or not callable(getattr(ds, "record_extents", None)) \
                or not mixture.quotas[s]:
            continue
        inner = ds.record_extents()
        if inner is not None:
            parts.append(SourceExtents(mixture, s, inner))
    return MixtureExtents(mixture, parts) if parts else None


def chunked_parts(mixture: Any) -> List[tuple]:
    """(chunk cache, ``SourceExtents``) of each source read through a bucket's chunk cache, to fetch its chunks in
    the mixture's order."""
    return [(ds.chunks, SourceExtents(mixture, s, ds.record_extents())) for s, ds in enumerate(mixture.sources)
            if getattr(ds, "chunks", None) is not None and callable(getattr(ds, "record_extents", None))
            and mixture.quotas[s]]
