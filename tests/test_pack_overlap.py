"""The pipeline reports each finished task to its writer (``Writer.task_done``)
while the others run, and the single-writer formats (lmdb, hdf5) copy finished
tasks into their one output file then, in task order, instead of all at the
end; a failing pack closes that file (``Writer.abort``)."""
from __future__ import annotations

import multiprocessing
import os
from typing import Any, List, Tuple

import h5py
import lmdb
import numpy as np
import pytest
from conftest import make_tree, sized
from test_single_writer import assert_same_as_mmap

from pixfeed.datasets import MmapImageDataset, open_dataset
from pixfeed.errors import SourceError
from pixfeed.packers import lmdb as lmdb_writer
from pixfeed.packers import pack
from pixfeed.packers.mmap import MmapWriter
from pixfeed.packers.writer import Writer
from pixfeed.registry import writer_class
from pixfeed.sources.folder import scan

BROKEN = b"\xff\xd8\xff not really a jpeg"


@pytest.mark.parametrize("workers", [1, 2])
def test_task_done_sees_every_task_in_the_main_process(image_tree, tmp_path, monkeypatch, workers):
    seen: List[Tuple[int, int]] = []
    monkeypatch.setattr(MmapWriter, "task_done", lambda self, result: seen.append((result.task, os.getpid())))
    pack(image_tree, tmp_path / "out", "mmap", size=16, workers=workers)
    assert sorted(seen) == [(task, os.getpid()) for task in range(len(seen))] and len(seen) > 1


def gate_last_task(monkeypatch, fmt: str) -> Tuple[List[Tuple[int, int]], List[Any]]:
    """Hold the last task (in its worker) until the main process has copied task 0,
    so a pack only completes if copying overlaps the workers (an Event shared
    through fork: no polling, no timing).  Returns the (first record, task) of
    each copy and the output handles opened, as they happen."""
    gate = multiprocessing.get_context("fork").Event()
    cls = writer_class(fmt)
    write_task, copy_task, open_output = cls.write_task, cls.copy_task, cls.open_output
    copies: List[Tuple[int, int]] = []
    handles: List[Any] = []

    def held_write_task(self, task, indices, records):
        if indices[-1] == len(self.source) - 1 and not gate.wait(timeout=120):
            raise RuntimeError("no task was copied while the last one ran")
        return write_task(self, task, indices, records)

    def spied_copy_task(self, first, result):
        copy_task(self, first, result)
        copies.append((first, result.task))
        gate.set()

    def spied_open_output(self):
        handles.append(open_output(self))
        return handles[-1]

    monkeypatch.setattr(cls, "write_task", held_write_task)
    monkeypatch.setattr(cls, "copy_task", spied_copy_task)
    monkeypatch.setattr(cls, "open_output", spied_open_output)
    monkeypatch.setattr(lmdb_writer, "_TXN_BYTES", 1)  # commit every record as it is copied
    return copies, handles


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
@pytest.mark.parametrize("store", ["pixels", "encoded"])
def test_tasks_are_copied_in_order_while_the_last_one_runs(tmp_path, monkeypatch, fmt, store):
    src = make_tree(tmp_path / "src", per_class=8)
    (src / "cat" / "broken.jpg").write_bytes(BROKEN)  # record 0, task 0
    (src / "dog" / "broken.jpg").write_bytes(BROKEN)  # task 2
    copies, _ = gate_last_task(monkeypatch, fmt)
    m = pack(src, tmp_path / fmt, fmt, store=store, **sized(store, 16), workers=2, on_error="skip")
    pack(src, tmp_path / "mmap", "mmap", store=store, **sized(store, 16), workers=2, on_error="skip")
    assert [s["path"] for s in m["skipped"]] == ["cat/broken.jpg", "dog/broken.jpg"]
    assert [task for _, task in copies] == list(range(8))  # 26 images in 8 tasks (4 per worker)
    source = scan(src)
    broken = {source.paths.index("cat/broken.jpg"), source.paths.index("dog/broken.jpg")}
    kept = [sum(int(i) not in broken for i in task) for task in Writer(tmp_path, source, None).plan(2)]
    assert [first for first, _ in copies] == np.cumsum([0] + kept[:-1]).tolist()  # skipped take no number
    assert_same_as_mmap(open_dataset(tmp_path / fmt), MmapImageDataset(tmp_path / "mmap"))


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_failing_pack_closes_the_output(tmp_path, monkeypatch, fmt):
    src = make_tree(tmp_path / "src", per_class=8)
    (src / "eel" / "zzz.jpg").write_bytes(BROKEN)  # the last image: fails the last task
    copies, handles = gate_last_task(monkeypatch, fmt)
    with pytest.raises(SourceError, match="zzz.jpg"):
        pack(src, tmp_path / "out", fmt, store="pixels", size=16, workers=2)
    assert copies and len(handles) == 1 and _closed(handles[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def _closed(handle: Any) -> bool:
    if isinstance(handle, h5py.File):
        return not handle.id.valid
    try:
        handle.info()
    except lmdb.Error:
        return True
    return False
