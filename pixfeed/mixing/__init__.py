"""Several datasets in one loader: ``pixfeed.mix([a, b], weights=[3, 1])`` is a dataset that
``make_loader`` reads like any other (docs/mixing.md).

``quotas.py`` says what an epoch holds, ``sources.py`` checks the sources and maps their classes,
``dataset.py`` is the ``Mixture`` of map-style sources the loader reads, ``streams.py`` the
``StreamMixture`` of WebDataset packs, interleaved, and ``extents.py`` where a mixture's samples lie in
its sources' files, for the loader's read-ahead and fetch-ahead in the mixture's order.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from torch.utils.data import IterableDataset

from .dataset import Mixed, Mixture
from .sources import opened
from .streams import StreamMixture

__all__ = ["Mixture", "StreamMixture", "mix"]


def mix(sources: Sequence[Any], weights: Optional[Sequence[float]] = None, *, epoch_size: Optional[int] = None,
        counts: Optional[Sequence[int]] = None, repeats: Optional[Sequence[float]] = None, labels: str = "by_name",
        with_source: bool = False) -> Mixed:
    """A dataset of several map-style datasets (or dataset paths), or of several WebDataset packs (a
    ``StreamMixture``: their streams interleaved, docs/mixing.md), each opened with its own options and
    agreeing in image shape and fields.  An epoch is, by the first of these given: ``weights`` (relative
    shares of ``epoch_size`` samples, by default as many as the sources hold), ``counts`` (samples of
    each source), ``repeats`` (times each source is seen: 2.5 is every sample twice and half of them once
    more), or by default every sample of every source once.  ``labels="by_name"`` maps each source's classes
    by name into one list (``mixture.classes``); ``"as_stored"`` keeps each source's labels.
    ``with_source=True`` adds each sample's source index after its fields.  Bad input raises
    ``pixfeed.errors.MixtureError`` here, before any worker starts."""
    if isinstance(sources, Sequence) and not isinstance(sources, (str, bytes)):
        sources = [opened(s) for s in sources]
        if any(isinstance(s, IterableDataset) for s in sources):
            return StreamMixture(sources, weights, epoch_size=epoch_size, counts=counts, repeats=repeats,
                                 labels=labels, with_source=with_source)
    return Mixture(sources, weights, epoch_size=epoch_size, counts=counts, repeats=repeats, labels=labels,
                   with_source=with_source)
