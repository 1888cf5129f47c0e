"""Checking a mixture's sources before anything is read: each one a dataset with samples (all map-style, or
all WebDataset packs), given once, and all agreeing in image shape and fields (``check``); their classes
mapped by name into one list (``class_maps``)."""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import IterableDataset

from ..errors import MixtureError

LABELS = ("by_name", "as_stored")


def name_of(dataset: Any, i: int) -> str:
    """How messages and the plan name source ``i``."""
    path = getattr(dataset, "path", None)
    return f"source {i} ({path})" if path is not None else f"source {i} ({type(dataset).__name__})"


def opened(source: Any) -> Any:
    """A dataset given as a path (str or PathLike) opened as ``open_dataset`` opens it, with its defaults."""
    return open_path(os.fsdecode(source)) if isinstance(source, (str, bytes, os.PathLike)) else source


def open_path(path: str, **options: Any) -> Any:
    """``open_dataset(path, **options)`` (not imported: ``open_dataset`` opens mixture files with this package)."""
    from ..manifest import read_manifest
    from ..registry import reader_class

    manifest = read_manifest(path, options.get("storage_options"), options.get("allow_links", False))
    return reader_class(manifest["format"])(path, manifest=manifest, **options)


def image_shape(dataset: Any) -> Optional[Tuple[int, ...]]:
    """(3, H, W) of the images a source returns (before a transform), or None when they vary or are unknown."""
    size = getattr(dataset, "size", None)
    if size is not None:
        return (3, *size)
    stored = getattr(dataset, "stored_shape", None)
    if stored is not None:
        return (3, *stored[:2])
    return getattr(dataset, "fixed_shape", None)


def _where(dataset: Any) -> Optional[str]:
    """The dataset's location, to tell one given twice (a local path resolved; a URL as written)."""
    path = getattr(dataset, "path", None)
    if path is None:
        return None
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    return text if "://" in text else os.path.realpath(text)


def _schema(dataset: Any) -> Optional[dict]:
    """{field name: type spec} of the fields a pixfeed source returns besides image and label."""
    schema = getattr(dataset, "schema", None)
    if schema is None:
        return None
    fields = getattr(dataset, "fields", None)
    return {f.name: f.spec for f in schema if fields is None or f.name in fields}


def records_in(dataset: Any) -> int:
    """A source's records (a WebDataset's in all its shards: its ``len`` is one rank's share)."""
    return int(dataset.manifest["count"]) if is_stream(dataset) else len(dataset)


def is_stream(dataset: Any) -> bool:
    """Whether ``dataset`` is a pack read as a stream of shards that a ``StreamMixture`` can interleave."""
    return isinstance(dataset, IterableDataset) and callable(getattr(dataset, "_select", None)) and \
        isinstance(getattr(dataset, "shards", None), list)


def check(sources: Sequence[Any], streams: bool = False) -> List[str]:
    """The sources' names, once every rule of the module's docstring holds; else MixtureError naming the fault.
    ``streams``: the sources are WebDataset packs, to interleave (``streams.StreamMixture``)."""
    if isinstance(sources, (str, bytes, os.PathLike)) or not isinstance(sources, Sequence) or not sources:
        raise MixtureError(f"mix({sources!r}, ...): give a list of datasets (or dataset paths), at least one")
    names = [name_of(ds, i) for i, ds in enumerate(sources)]
    iterable = [isinstance(ds, IterableDataset) for ds in sources]
    if any(iterable) and not all(iterable):
        i, j = iterable.index(True), iterable.index(False)
        raise MixtureError(f"{names[i]} is an iterable dataset (read as a stream of its shards) and {names[j]} a "
                           "map-style one (read by index): mix map-style sources only, or WebDataset packs only; "
                           "repack one of them so that they agree (pixfeed pack SRC NEW --format mmap, or --format "
                           "wds)")
    for i, (ds, name) in enumerate(zip(sources, names)):
        if iterable[i] and not (streams and is_stream(ds)):
            raise MixtureError(f"{name}: an iterable dataset other than a pixfeed WebDataset pack (it orders and "
                               "splits its own samples, so a mixture cannot give it a quota); open the pack with "
                               "pixfeed.open_dataset and mix it with pixfeed.mix" if not is_stream(ds) else
                               f"{name}: a WebDataset pack; pixfeed.mix interleaves such sources (a StreamMixture), "
                               "a Mixture reads map-style ones")
        if not hasattr(ds, "__getitem__") or not hasattr(ds, "__len__"):
            raise MixtureError(f"{name}: {type(ds).__name__} is not a dataset (no __getitem__ and __len__)")
        if records_in(ds) == 0:
            raise MixtureError(f"{name}: holds no samples; an empty source cannot take a share of an epoch "
                               "(leave it out of the mixture)")
        for j in range(i):
            if sources[j] is ds or (_where(ds) is not None and _where(ds) == _where(sources[j])):
                raise MixtureError(f"{name}: the same dataset as {names[j]}, given twice; give it once with a "
                                   "larger weight (weights=, counts= or repeats=) to see it more often")
    _agree(sources, names)
    return names


def _agree(sources: Sequence[Any], names: List[str]) -> None:
    first, name = sources[0], names[0]
    for ds, other in zip(sources[1:], names[1:]):
        if getattr(ds, "fields", None) != getattr(first, "fields", None):
            raise MixtureError(f"{other} returns fields {getattr(ds, 'fields', None)!r}, {name} returns "
                               f"{getattr(first, 'fields', None)!r}; open every source with the same fields=")
        if _schema(ds) != _schema(first):
            raise MixtureError(f"{other} has fields {_schema(ds)!r}, {name} has {_schema(first)!r}; mix "
                               "sources whose fields agree in name and type (or select common ones with fields=)")
        transformed = any(getattr(d, "transform", None) is not None for d in (ds, first))
        if not transformed and image_shape(ds) != image_shape(first):
            raise MixtureError(f"{other} gives images of shape {_shape(image_shape(ds))}, {name} of "
                               f"{_shape(image_shape(first))}; open them with one size= (size=224) so that "
                               "their samples can share a batch")


def _shape(shape: Optional[Tuple[int, ...]]) -> str:
    return "x".join(map(str, shape)) if shape is not None else "varying sizes (no size=)"


def class_maps(sources: Sequence[Any], labels: str) -> Tuple[Optional[List[str]], List[Optional[np.ndarray]]]:
    """(the mixture's classes, per source a table from its labels to the mixture's or None: as stored).

    ``by_name``: the classes of every source in order of first appearance (the first source's list
    as it is, then each later source's new names), each source's labels mapped to them by name; a
    source without class names keeps its labels.  ``as_stored``: labels untouched, the classes a
    list only when every source has the same one.  A table ends with -1, so label -1 (unlabelled)
    stays -1."""
    if labels not in LABELS:
        raise MixtureError(f"labels={labels!r}: expected {' or '.join(map(repr, LABELS))}")
    lists = [getattr(ds, "classes", None) for ds in sources]
    if labels == "as_stored":
        same = all(c == lists[0] for c in lists)
        return (list(lists[0]) if same and lists[0] is not None else None), [None] * len(sources)
    classes: List[str] = []
    index = {}
    for names in lists:
        for c in names or ():
            if c not in index:
                index[c] = len(classes)
                classes.append(c)
    tables = []
    for names in lists:
        if names is None or list(names) == classes[:len(names)]:
            tables.append(None)  # labels already the mixture's
        else:
            tables.append(np.array([index[c] for c in names] + [-1], dtype=np.int64))
    return (classes if any(lists) else None), tables
