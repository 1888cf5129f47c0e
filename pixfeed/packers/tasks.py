"""A pack task and what runs it: ``run_task`` (one slice of the source into records, handed to the
writer) and ``Executor``, the base of the local and Ray executors (``executors.py``, ``ray_executor.py``)."""
from __future__ import annotations

from typing import Callable, Iterator, List, Sequence

import numpy as np

from ..errors import SourceError
from .fieldparts import FieldParts
from .records import Record, load_record
from .sizes import scale
from .writer import TaskResult, Writer


def run_task(writer: Writer, task: int, indices) -> TaskResult:
    """Pack the source images ``indices`` as task ``task``; return what the driver needs."""
    result = TaskResult(task)

    def records() -> Iterator[Record]:
        for i, data in writer.source.fetch(indices):
            try:
                rec = load_record(writer.source, i, writer.opts, result.notes, data, writer.needs_shape)
            except SourceError as e:
                if writer.opts.on_error == "fail":
                    e.source_index = i  # for first_bad: the error a pack reports is the first in source order
                    raise
                result.skipped.append({"path": writer.source.paths[i], "reason": str(e)})
                continue
            if rec.encoding == "raw" and rec.source_shape:
                enlarged = scale(rec.source_shape, writer.opts.size, writer.opts.resize)
                if enlarged > 1:
                    result.upscaled += 1
                    result.upscale_max = max(result.upscale_max, enlarged)
            result.kept.append(rec.index)
            result.checksums.append(rec.checksum)
            result.stored_bytes += rec.data.nbytes if isinstance(rec.data, np.ndarray) else len(rec.data)
            if rec.fields:
                result.field_lengths.append([len(b) for b in rec.fields.values()])
                result.field_checksums.append(rec.field_checksums)
                result.stored_bytes += sum(result.field_lengths[-1])
            yield rec

    stream = records()
    if writer.source.schema and not writer.own_fields:
        stream = FieldParts(writer.root).tee(task, stream)
    result.extra = writer.write_task(task, indices, stream)
    return result


def first_bad(writer: Writer, tasks: List[np.ndarray], finished: Sequence[int], error: SourceError) -> SourceError:
    """The error of the bad source image first in source order, whatever order the tasks met them in
    (a wds pack's tasks hold shuffled samples; parallel tasks race): ``error`` came from the source
    image ``error.source_index``; the images before it that no finished task packed are checked here,
    in source order, by the tasks' own rule (``load_record``), and the first that fails wins.  Every
    format so names the same file for the same folder."""
    failed = getattr(error, "source_index", None)
    if failed is None:
        return error
    packed = np.zeros(failed, dtype=bool)
    for t in finished:
        done = tasks[t][tasks[t] < failed]
        packed[done] = True
    earlier = np.flatnonzero(~packed)
    for i, data in writer.source.fetch(earlier):
        try:
            load_record(writer.source, i, writer.opts, [], data, writer.needs_shape)
        except SourceError as e:
            return e
    return error


class Executor:
    """Runs pack tasks.  ``with executor:`` holds what it needs (a cluster connection);
    ``slots`` is how many tasks it runs at once (the plan's parallelism)."""

    slots = 1

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def run(self, writer: Writer, tasks: List[np.ndarray]) -> Iterator[TaskResult]:
        """Yield each task's result as it finishes; stop the others when closed early."""
        raise NotImplementedError

    def map(self, fn: Callable, items: Sequence) -> List:
        """``fn(item)`` for every item, in the items' order as ``map`` gives them, run as the executor runs
        tasks (``pack_samples``' function over its inputs, the walks of a pack's shards); inside
        ``with executor:``.  The first item that raises stops the others."""
        done = dict(self._as_done(lambda job: (job[0], fn(job[1])), list(enumerate(items))))
        return [done[n] for n in range(len(done))]

    def _as_done(self, fn: Callable, items: List) -> Iterator:
        """``fn(item)`` for every item, yielded as each finishes."""
        raise NotImplementedError
