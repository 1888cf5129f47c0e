"""PlacedFile: records written once into regions placed ahead; gaps closed, overflow joined, the
file hashed while tasks run exactly when every region was filled; FileHasher's one pass."""
from __future__ import annotations

import json

import numpy as np
import pytest
import xxhash

import pixfeed
from conftest import make_tree
from pixfeed.checksum import FileHasher, file_hash
from pixfeed.packers.placed import PlacedFile
from pixfeed.packers.records import Record
from pixfeed.packers.writer import TaskResult
from pixfeed.verify.check import verify


def records(blobs):
    return [Record(i, str(i), 0, b, "jpeg", (1, 1), 0, (1, 1)) for i, b in enumerate(blobs)]


def run(tmp_path, planned, written, order=None):
    """Tasks with ``planned`` sizes per record write ``written`` blobs (per task); return
    (file bytes, what join returned)."""
    placed = PlacedFile(tmp_path / "data.bin")
    tasks = [np.arange(sum(map(len, planned[:k])), sum(map(len, planned[:k + 1]))) for k in range(len(planned))]
    placed.begin(np.array([s for task in planned for s in task]), tasks)
    results = [TaskResult(k, extra=placed.write(k, records(blobs))) for k, blobs in enumerate(written)]
    for k in order or range(len(results)):  # results reach the driver in any order
        placed.task_done(results[k])
    hashed = placed.join(results)
    assert not placed.parts.exists()
    return (tmp_path / "data.bin").read_bytes(), hashed


def blobs(rng, sizes):
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


@pytest.mark.parametrize("case", ["exact", "smaller", "larger", "mixed"])
def test_the_file_is_every_record_in_task_order(tmp_path, case):
    rng = np.random.default_rng(1)
    planned = [[100, 50, 70], [30], [200, 10], []]
    sizes = {"exact": planned, "smaller": [[90, 50, 0], [30], [150, 10], []],
             "larger": [[100, 50, 71], [30], [300, 10], []], "mixed": [[100, 60, 70], [29], [200, 10], [5]]}[case]
    written = [blobs(rng, task) for task in sizes]
    data, hashed = run(tmp_path, planned, written, order=[2, 0, 3, 1])
    assert data == b"".join(b for task in written for b in task)
    if case == "exact":  # hashed while tasks ran: the file's hash and its chunk hashes, as read afterwards
        assert hashed == (file_hash(tmp_path / "data.bin"), [xxhash.xxh3_64_hexdigest(data)])
    else:
        assert hashed is None


def test_begin_reserves_the_files_blocks(tmp_path):
    """Its blocks are allocated before any task writes (a full disk fails there), not a sparse file."""
    placed = PlacedFile(tmp_path / "data.bin")
    placed.begin(np.full(8, 64 << 10), [np.arange(4), np.arange(4, 8)])
    stat = (tmp_path / "data.bin").stat()
    assert stat.st_size == 8 * (64 << 10) and stat.st_blocks * 512 >= stat.st_size
    placed.abort()


def test_file_hasher_splits_chunks_wherever_the_updates_end(tmp_path):
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, 10_000, dtype=np.uint8).tobytes()
    hasher, pos = FileHasher(1024), 0
    for cut in sorted(rng.integers(0, len(data), 20)) + [len(data)]:
        hasher.update(data[pos:cut])
        pos = cut
    chunks = [xxhash.xxh3_64_hexdigest(data[k:k + 1024]) for k in range(0, len(data), 1024)]
    assert hasher.result() == (xxhash.xxh3_64_hexdigest(data), chunks)
    (tmp_path / "f").write_bytes(data)
    again = FileHasher(1024)
    with open(tmp_path / "f", "rb") as f:
        again.feed(f.fileno(), 0, len(data))
    assert again.result() == hasher.result()


@pytest.mark.parametrize("options", [{}, {"max_side": 16}, {"on_error": "skip"}])
def test_packs_verify_whichever_way_data_bin_was_made(tmp_path, options):
    """Files stored as they are (hashed while tasks ran), re-encoded (smaller: gaps closed), with a
    damaged file skipped: every record reads back as its source and `verify` passes."""
    src = make_tree(tmp_path / "src", classes=("a", "b"), per_class=6)
    if options.get("on_error"):
        (src / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    out = tmp_path / "out"
    pixfeed.pack(src, out, "mmap", store="encoded", workers=2, **options)
    ds = pixfeed.open_dataset(out)
    manifest = json.loads((out / "pixfeed.json").read_text())
    assert manifest["files"]["data.bin"]["xxh3_64"] == file_hash(out / "data.bin")
    report = verify(out)
    assert report.ok and report.records == len(ds) == 12, report.problems
    if not options:
        files = {p.relative_to(src).with_suffix("").as_posix(): p.read_bytes() for p in src.rglob("*.*")}
        for i in range(len(ds)):
            assert bytes(ds.read_checked([i])[1][0]) == files[ds.key(i)]
