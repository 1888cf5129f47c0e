"""A mixture file: a small JSON object naming the sources, each with the options it is opened with, and
what an epoch is; ``pixfeed.open_dataset("mix.json")`` opens it as its mixture, ``pixfeed info``
describes it (docs/mixing.md#a-mixture-file)::

    {"pixfeed_mixture": 1,
     "sources": [{"path": "photos", "size": 224, "crop": "random"}, {"path": "s3://bucket/extra", "size": 224}],
     "weights": [3, 1], "epoch_size": 100000}

A source's keys other than ``path`` are ``open_dataset``'s keyword arguments (JSON values: ``size``,
``crop``, ``fields``, ``cache_limit``, ``storage_options``, ...); a relative path is relative to the
file's folder.  The other top-level keys are ``pixfeed.mix``'s: ``weights``, ``epoch_size``,
``counts``, ``repeats``, ``labels``, ``with_source``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import MixtureError
from ..storage.bounded import MANIFEST_BYTES, read_file
from ..storage.bounded import loads as bounded_loads

VERSION = 1
MIX_KEYS = ("weights", "epoch_size", "counts", "repeats", "labels", "with_source")


def is_mixture_file(path: Any) -> bool:
    """Whether ``path`` names a local ``.json`` file (a mixture file, then: ``read`` checks the rest)."""
    if not isinstance(path, (str, os.PathLike)) or "://" in os.fspath(path):
        return False
    return os.fspath(path).endswith(".json") and Path(path).is_file()


def read(path: Any) -> dict:
    """The mixture file's object, checked: MixtureError naming the file and the key at fault."""
    where = os.fspath(path)
    try:
        spec = bounded_loads(read_file(path, MANIFEST_BYTES, where, "mixture file"), where)
    except ValueError as e:
        raise MixtureError(f"{where}: not a mixture file: not valid JSON ({e})") from None
    if not isinstance(spec, dict) or spec.get("pixfeed_mixture") != VERSION:
        raise MixtureError(f"{where}: not a mixture file: expected a JSON object with \"pixfeed_mixture\": {VERSION}")
    unknown = sorted(set(spec) - {"pixfeed_mixture", "sources", *MIX_KEYS})
    if unknown:
        raise MixtureError(f"{where}: unknown key {unknown[0]!r}; a mixture file has sources and "
                           f"{', '.join(MIX_KEYS)}")
    sources = spec.get("sources")
    if not isinstance(sources, list) or not sources or not all(isinstance(s, dict) for s in sources):
        raise MixtureError(f"{where}: \"sources\" must be a list of objects, each with a \"path\"")
    for i, source in enumerate(sources):
        if not isinstance(source.get("path"), str) or not source["path"]:
            raise MixtureError(f"{where}: source {i} has no \"path\" (a dataset folder or URL)")
    return spec


def load(path: Any, transform: Any = None, **options: Any) -> Any:
    """``open_dataset`` of a mixture file: each source opened with its options, then ``pixfeed.mix``."""
    from . import mix
    from .sources import open_path

    if transform is not None or options:
        raise MixtureError(f"{os.fspath(path)}: a mixture file names each source's options itself; give "
                           f"{'transform' if transform is not None else sorted(options)[0]} to its sources there "
                           "(or open them in Python and call pixfeed.mix)")
    spec, folder = read(path), Path(path).parent
    datasets = []
    for i, source in enumerate(spec["sources"]):
        where, given = source["path"], {k: v for k, v in source.items() if k != "path"}
        if "://" not in where and not os.path.isabs(where):
            where = os.fspath(folder / where)
        try:
            datasets.append(open_path(where, **given))
        except TypeError as e:
            raise MixtureError(f"{os.fspath(path)}: source {i} ({source['path']}): {e}") from None
    return mix(datasets, **{k: spec[k] for k in MIX_KEYS if k in spec})


def describe(path: Any) -> list:
    """``pixfeed info``'s rows of a mixture file: its sources with their options, what an epoch is, the quotas."""
    spec, mixture = read(path), load(path)
    kind, total = mixture.kind, sum(mixture.quotas)
    epoch = "every sample of every source once" if kind == "once" else \
        f"{kind} {', '.join(f'{v:g}' for v in mixture.given)}" + \
        (f", epoch_size {total:,}" if kind == "weights" else "")
    sources = []
    for i, (source, n, quota) in enumerate(zip(spec["sources"], mixture.lengths, mixture.quotas)):
        options = ", ".join(f"{k}={v!r}" for k, v in source.items() if k != "path") or "defaults"
        sources.append(f"{i}: {source['path']} ({mixture.sources[i].manifest['format']}, {n:,} records; {options}): "
                       f"{quota:,} an epoch ({quota / total:.1%})")
    classes = mixture.classes
    return [("mixture", f"{len(mixture.sources)} sources ({mixture.labels} labels"
                        f"{', with_source' if mixture.with_source else ''})"),
            ("sources", sources), ("epoch", epoch), ("epoch size", f"{total:,} samples"),
            ("classes", "none" if classes is None else
             f"{len(classes)}: {', '.join(classes[:8])}{' ...' if len(classes) > 8 else ''}")]
