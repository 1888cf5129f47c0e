"""``Mixture``: several map-style datasets read as one, its epoch made of a quota of each (``quotas.py``).

A mixture is a map-style dataset of ``sum(quotas)`` samples: index ``v`` of an epoch is position
``v - offset[s]`` of source ``s``'s quota, which its ``Stream`` maps to a record for that epoch.
``make_loader`` treats it as any dataset: its sampler shuffles the ``len(mixture)`` indices with
(seed, epoch), deals them out to ranks and resumes part-way (``pixfeed.loaders.sampler``), so the
order across sources, the split by rank and ``state_dict`` are the ones a single dataset has.  The
loader hands the mixture its ``seed`` (``use_seed``) and calls ``set_epoch``; the epoch is kept
in shared memory, so persistent workers see it.

Reading: ``get_batch`` groups a batch's indices by source and reads each group with that
source's own ``get_batch`` straight into its rows of one batch array (``out=``: no second copy),
so a batch holds the samples its indices name, grouped by source.  Random crops draw from
generators seeded from (seed, source, pass, record) when the loader seeds per sample, so a record
seen twice in an epoch (repeats=2) gets two crops.  Labels are mapped into the mixture's
``classes`` (``sources.class_maps``); ``with_source=True`` adds each sample's source index after
its fields (a third element, a batch's int64 column, or a dict's ``"source"``).
"""
from __future__ import annotations

import functools
import inspect
import json
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..checksum import record_hash
from ..console.words import plural
from ..image import buffers as batchbuffers
from ..seeds import seeded_by_index
from .extents import MixtureExtents, chunked_parts, mixture_extents
from .quotas import Stream, quotas
from .sources import check, class_maps, opened, records_in

COLUMNS = ("image", "label")


class Mixed:
    """What every mixture holds and says, map-style (``Mixture``) or streamed (``streams.StreamMixture``):
    its checked sources, quotas, classes, epoch, seed and the plan's lines."""

    epoch_in_shared_memory = True

    def __init__(self, sources: Sequence[Any], weights: Optional[Sequence[float]] = None, *,
                 epoch_size: Optional[int] = None, counts: Optional[Sequence[int]] = None,
                 repeats: Optional[Sequence[float]] = None, labels: str = "by_name", with_source: bool = False,
                 streams: bool = False):
        if isinstance(sources, Sequence) and not isinstance(sources, (str, bytes)):
            sources = [opened(s) for s in sources]
        self.names = check(sources, streams)
        self.sources = list(sources)
        self.lengths = [records_in(s) for s in self.sources]
        epoch = quotas(self.lengths, self.names, weights=weights, epoch_size=epoch_size, counts=counts,
                       repeats=repeats)
        self.quotas: List[int] = epoch["quotas"]
        self.kind, self.given = epoch["kind"], epoch["given"]
        self.classes, self._tables = class_maps(self.sources, labels)
        self.labels, self.with_source = labels, bool(with_source)
        self.seed = 0
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        first = self.sources[0]
        self.fields = getattr(first, "fields", COLUMNS)  # a dataset without fields= returns (image, label)
        self.default_fields = getattr(first, "default_fields", True) and not self.with_source
        self.transform = next((s.transform for s in self.sources if getattr(s, "transform", None) is not None), None)
        self.path = "mixture of " + ", ".join(str(getattr(s, "path", type(s).__name__)) for s in self.sources)

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    def use_seed(self, seed: int) -> None:
        """The loader's ``seed``: which records fill each epoch's quotas, and their crops, follow it."""
        self.seed = int(seed)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    @property
    def deterministic(self) -> bool:
        return all(getattr(s, "deterministic", False) for s in self.sources)

    @property
    def rng_per_sample(self) -> bool:
        """Every source draws nothing or draws through ``index_rng`` (pixfeed's random crops)."""
        return not self.deterministic and all(getattr(s, "deterministic", False) or getattr(s, "rng_per_sample", False)
                                              for s in self.sources)

    @property
    def cpu_bound(self) -> bool:
        return any(getattr(s, "cpu_bound", True) for s in self.sources)

    @property
    def fingerprint(self) -> str:
        """Which mixture a loader state belongs to: its sources (their manifests), quotas and label mode."""
        parts = [_identity(s) for s in self.sources] + [self.quotas, self.kind, self.labels, self.with_source]
        return f"{record_hash(json.dumps(parts, sort_keys=True).encode()):016x}"

    def _relabel(self, sample: Any, source: int) -> Any:
        table = self._tables[source]
        if table is None and not self.with_source:
            return sample
        if isinstance(sample, dict):
            if table is not None and "label" in sample:
                sample["label"] = int(table[sample["label"]])
            if self.with_source:
                sample["source"] = source
            return sample
        sample = list(sample)
        at = _label_column(self.fields)
        if table is not None and at is not None:
            sample[at] = int(table[sample[at]])
        return (*sample, source) if self.with_source else tuple(sample)

    def plan_sources(self) -> List[str]:
        """The loader plan's lines, one per source: its share of an epoch, what was asked, what reading it costs."""
        total = sum(self.quotas)
        lines = []
        for ds, name, n, q, given in zip(self.sources, self.names, self.lengths, self.quotas,
                                         self.given or [None] * len(self.sources)):
            asked = "every sample once" if given is None else f"{self.kind[:-1]} {given:g}"
            lines.append(f"{'':<21}{name}: {q:,} of {total:,} samples an epoch ({q / total:.1%}; {asked}: {q / n:.3g}x its "
                         f"{plural(n, 'record')}); {_cost(ds)}")
        return lines


class Mixture(Mixed, Dataset):
    """``pixfeed.mix(sources, weights=None, *, epoch_size=None, counts=None, repeats=None,
    labels="by_name", with_source=False)`` of map-style sources; see the module's docstring."""

    def __init__(self, sources: Sequence[Any], weights: Optional[Sequence[float]] = None, **options: Any):
        super().__init__(sources, weights, **options)
        self.offsets = np.cumsum([0, *self.quotas]).astype(np.int64)
        self.streams = [Stream(n, q, i) for i, (n, q) in enumerate(zip(self.lengths, self.quotas))]
        self._takes = [_parameters(s) for s in self.sources]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    @functools.cached_property
    def _columns(self) -> tuple:
        """(image column, the batch's shape when the sources read into its rows else None, label column, and
        whether every source reads its stored pixels straight into those rows: ``read_into``)."""
        image, shape = _image_column(self.fields), self.fixed_shape
        direct = shape is not None and image is not None and self.transform is None and \
            all("out" in t for t in self._takes)
        rows = direct and tuple(self.fields) == COLUMNS and all(
            getattr(s, "reads_into", False) and not s.cpu_bound and s.default_fields for s in self.sources)
        return image, shape if direct else None, _label_column(self.fields), rows

    @property
    def fixed_shape(self) -> Optional[Tuple[int, int, int]]:
        """The sources' common ``fixed_shape`` when each reads whole batches (``get_batch``), else None."""
        shapes = {getattr(s, "fixed_shape", None) for s in self.sources}
        if len(shapes) != 1 or None in shapes or not all(callable(getattr(s, "get_batch", None))
                                                          for s in self.sources):
            return None
        return shapes.pop()

    def record_extents(self) -> Optional[MixtureExtents]:
        """Where the samples of the epoch's order lie in the sources' files, for read-ahead (``extents.py``)."""
        return mixture_extents(self)

    def chunked_parts(self) -> List[tuple]:
        """(chunk cache, extents of this mixture's indices) of each source in a bucket read through chunks."""
        return chunked_parts(self)

    # where a sample comes from -----------------------------------------------------------------------------
    def locate(self, indices: Sequence[int]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, record, pass) of each of ``indices`` in the current epoch."""
        v = np.asarray(indices, dtype=np.int64).reshape(-1)
        order = np.argsort(v, kind="stable")
        source, records, passes, _ = self._grouped(self._checked(v[order]))
        out = [np.empty_like(v) for _ in range(3)]
        for a, b in zip(out, (source, records, passes)):
            a[order] = b
        return tuple(out)

    def _checked(self, indices: Sequence[int]) -> np.ndarray:
        """``indices`` as a sorted int64 array, each checked to lie in the epoch (IndexError naming one)."""
        v = np.sort(np.asarray(indices, dtype=np.int64).reshape(-1))
        if v.size and (v[0] < 0 or v[-1] >= len(self)):
            bad = v[0] if v[0] < 0 else v[-1]
            raise IndexError(f"{self.path}: index {bad} out of range for an epoch of {len(self)} samples")
        return v

    def _grouped(self, v: np.ndarray) -> tuple:
        """(source, record, pass, bounds) of the sorted, checked indices ``v``: sources are contiguous runs
        (their quotas are consecutive ranges), each run in its own order; ``bounds[s]:bounds[s + 1]`` is
        source ``s``'s run.  Slices, no per-source masks: a batch of 64 in about 20 us."""
        bounds = np.searchsorted(v, self.offsets).tolist()
        source, records, passes = np.empty_like(v), np.empty_like(v), np.empty_like(v)
        epoch = self.epoch
        for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if lo < hi:
                source[lo:hi] = s
                records[lo:hi], passes[lo:hi] = self.streams[s].records(self.seed, epoch, v[lo:hi] - self.offsets[s])
        return source, records, passes, bounds

    def key(self, index: int) -> str:
        """Sample ``index``'s key in its source (this epoch)."""
        source, record, _ = self.locate([index])
        ds = self.sources[int(source[0])]
        return ds.key(int(record[0])) if callable(getattr(ds, "key", None)) else str(int(record[0]))

    def _draws(self, source: int, passed: int):
        """Random crops drawn from (seed, source, pass, record) in place of (seed, epoch, record), so two
        sources' record 5, or one record in two passes of an epoch, draw apart."""
        return seeded_by_index(self.seed, passed * len(self.sources) + source)

    # reading -------------------------------------------------------------------------------------------------
    def __getitem__(self, index: int) -> Any:
        source, record, passed = (int(a[0]) for a in self.locate([index]))
        with self._draws(source, passed):
            sample = self.sources[source][record]
        return self._relabel(sample, source)

    def runs(self, indices: Sequence[int]) -> tuple:
        """(source, record, pass, runs) of a batch's ``indices`` in the order a batch holds them (sorted,
        grouped by source); ``runs``: (source, lo, hi) of each run of one source and pass, its records in
        file order.  ``get_batch`` reads each run with one call, as does the device path (``loaders.device``)."""
        source, records, passes, bounds = self._grouped(self._checked(indices))
        runs = []
        for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if hi - lo > 1 and not self.streams[s].in_order and \
                    (passes[lo] != passes[hi - 1] or (np.diff(records[lo:hi]) < 0).any()):
                order = lo + np.lexsort((records[lo:hi], passes[lo:hi]))
                records[lo:hi], passes[lo:hi] = records[order], passes[order]
                cuts = (lo + 1 + np.flatnonzero(np.diff(passes[lo:hi]) != 0)).tolist()
                runs += [(s, a, b) for a, b in zip([lo, *cuts], [*cuts, hi])]
            elif lo < hi:
                runs.append((s, lo, hi))
        return source, records, passes, runs

    def _read_rows(self, v: np.ndarray) -> tuple:
        """(images, labels[, sources]) of the sorted, checked indices ``v`` when every source ``read_into``s its
        rows and draws nothing (passes do not matter): one call per source, its records sorted (file order)."""
        bounds = np.searchsorted(v, self.offsets).tolist()
        shape = self._columns[1]
        out = batchbuffers.empty((len(v), shape[1], shape[2], 3))
        labels = np.empty(len(v), np.int64)
        for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if lo < hi:
                stream, local = self.streams[s], v[lo:hi] - self.offsets[s]
                records = local if stream.in_order else np.sort(stream.records(self.seed, self.epoch, local)[0])
                got = self.sources[s].read_into(records, out[lo:hi])
                labels[lo:hi] = got if self._tables[s] is None else self._tables[s][got]
        columns = (torch.from_numpy(out).permute(0, 3, 1, 2), torch.from_numpy(labels))
        if not self.with_source:
            return columns
        return (*columns, torch.from_numpy(np.repeat(np.arange(len(self.sources)), np.diff(bounds))))

    def get_batch(self, indices: Sequence[int], threads: int = 1) -> Tuple[Any, ...]:
        """One read per source of the batch, into its rows of one batch array (module docstring); the
        columns as a source's ``get_batch`` gives them, then the source indices with ``with_source``."""
        image, shape, at, rows = self._columns
        if rows:  # stored pixels, no per-sample work: one read per source into its rows
            return self._read_rows(self._checked(indices))
        source, records, passes, runs = self.runs(indices)
        out = batchbuffers.empty((len(source), shape[1], shape[2], 3)) if shape is not None else None
        parts = []
        for s, lo, hi in runs:
            options = {"threads": threads} if threads > 1 and "threads" in self._takes[s] else {}
            if out is not None:
                options["out"] = out[lo:hi]
            with self._draws(s, int(passes[lo])):
                columns = list(self.sources[s].get_batch(records[lo:hi], **options))
            table = self._tables[s]
            if table is not None and at is not None:
                columns[at] = torch.from_numpy(table[np.asarray(columns[at])])
            parts.append(columns)
        joined = [_join([p[j] for p in parts]) if j != image or out is None else None
                  for j in range(len(parts[0]))]
        if out is not None:
            joined[image] = torch.from_numpy(out).permute(0, 3, 1, 2)
        if self.with_source:
            joined.append(torch.from_numpy(source))
        return tuple(joined)


def _identity(dataset: Any) -> Any:
    manifest = getattr(dataset, "manifest", None)
    if isinstance(manifest, dict):
        return record_hash(json.dumps(manifest, sort_keys=True).encode())
    return f"{type(dataset).__module__}.{type(dataset).__qualname__}:{len(dataset)}"


def _parameters(dataset: Any) -> frozenset:
    """The keyword names a source's ``get_batch`` takes (``threads``, ``out``)."""
    method = getattr(dataset, "get_batch", None)
    try:
        return frozenset(inspect.signature(method).parameters) if callable(method) else frozenset()
    except (TypeError, ValueError):
        return frozenset()


def _label_column(fields: Optional[Sequence[str]]) -> Optional[int]:
    if fields is None:
        return None
    return list(fields).index("label") if "label" in fields else None


def _image_column(fields: Optional[Sequence[str]]) -> Optional[int]:
    if fields is None:
        return None
    return list(fields).index("image") if "image" in fields else None


def _join(values: List[Any]) -> Any:
    """One column of a batch from its groups' columns: tensors concatenated, lists chained."""
    if len(values) == 1:
        return values[0]
    if all(isinstance(v, torch.Tensor) for v in values):
        return torch.cat(values)
    return [item for v in values for item in v]


def _cost(dataset: Any) -> str:
    """What reading one record of a source costs, from what it says of itself."""
    manifest = getattr(dataset, "manifest", None)
    parts = []
    if isinstance(manifest, dict) and manifest.get("files") and manifest.get("count"):
        record = sum(m["bytes"] for m in manifest["files"].values()) / manifest["count"]
        where = "from a bucket" if getattr(dataset, "chunks", None) is not None or \
            getattr(dataset, "remote", None) is not None else "local"
        parts.append(f"{manifest['format']} {manifest.get('store', '')}, {record / 1024:,.1f} KiB a record, {where}")
    parts.append("decodes or crops each image (CPU work per sample)" if getattr(dataset, "cpu_bound", True)
                 else "stored pixels copied, no decode")
    return "; ".join(parts)
