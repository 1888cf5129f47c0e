"""The ray executor (``--executor ray``): the same dataset as the local executor, record
for record, for every format and store; a task whose worker dies is retried; --on-error
is followed; a killed driver leaves no manifest.  One local Ray (2 CPUs) serves the module."""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import HOLD, held_image, make_tree, sized

import pixfeed
from pixfeed import registry
from pixfeed.cli import main
from pixfeed.datasets import open_dataset
from pixfeed.errors import OptionError, SourceError
from pixfeed.manifest import read_manifest
from pixfeed.packers import pack

ray = pytest.importorskip("ray", reason="needs the ray extra (pip install 'pixfeed[ray]'; the test extra has it)")
from pixfeed.packers.ray_executor import CRASH_DIR_ENV  # noqa: E402  (needs ray)

CASES = [(f, s) for f in sorted(registry.FORMATS) for s in ("pixels", "encoded")]
BROKEN = b"\xff\xd8\xff not really a jpeg"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray of 2 CPUs for the module; yields the folder of the test-only crash hook."""
    crash = tmp_path_factory.mktemp("crash")
    os.environ[CRASH_DIR_ENV] = str(crash)  # before ray.init: its workers inherit it
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOLD), path]))  # every job's workers: the hold
    tests = str(Path(__file__).parent)  # functions of test modules (pack_samples' fn) import there
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}})
    yield crash
    ray.shutdown()
    del os.environ[CRASH_DIR_ENV]
    if path is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = path


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("ray") / "src", per_class=6)


def records(path: Path) -> list:
    """Every record as (key, label, stored bytes, checksum), read back through pixfeed or tar."""
    if json.loads((path / "pixfeed.json").read_text())["format"] == "wds":
        return [(m.name, tar.extractfile(m).read()) for shard in sorted(path.glob("*.tar"))
                for tar in [tarfile.open(shard)] for m in tar]  # .json members hold key, label, xxh3_64
    ds = open_dataset(path)
    stored, labels, checksums = ds.read_stored(np.arange(len(ds)))
    return [(ds.key(i), int(labels[i]), bytes(np.asarray(stored[i])), int(checksums[i])) for i in range(len(ds))]


def assert_same_pack(a: Path, b: Path) -> None:
    assert records(a) == records(b) and len(records(a)) > 0
    # a skip reason may quote Pillow's repr of a buffer, with its address
    ma, mb = (json.loads(re.sub(" at 0x[0-9a-f]+", "", (p / "pixfeed.json").read_text())) for p in (a, b))
    for m in (ma, mb):
        del m["stats"], m["created"]
    assert ma == mb  # files (bytes, xxh3), shards, skipped, notes, options


@pytest.mark.parametrize("fmt,store", CASES)
def test_ray_pack_equals_local_pack(cluster, src, tmp_path, fmt, store):
    pack(src, tmp_path / "local", fmt, store=store, **sized(store, 16), workers=2)
    m = pack(src, tmp_path / "ray", fmt, store=store, **sized(store, 16), executor="ray")
    assert m["count"] == 18
    assert_same_pack(tmp_path / "local", tmp_path / "ray")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local", "ray"]


@pytest.mark.parametrize("fmt,store", [("mmap", "pixels"), ("wds", "encoded")])
def test_a_task_whose_worker_dies_midway_is_retried(cluster, src, tmp_path, fmt, store):
    armed = cluster / "task-2"
    armed.touch()  # the first attempt of task 2 exits its worker after one record
    pack(src, tmp_path / "ray", fmt, store=store, **sized(store, 16), shard_size=5 if fmt == "wds" else None,
         executor="ray")
    assert not armed.exists(), "task 2 never ran its crashing first attempt"
    pack(src, tmp_path / "local", fmt, store=store, **sized(store, 16), shard_size=5 if fmt == "wds" else None, workers=2)
    assert_same_pack(tmp_path / "local", tmp_path / "ray")


def test_on_error_skip_and_fail(cluster, tmp_path):
    src = make_tree(tmp_path / "src", per_class=6)
    (src / "dog" / "broken.jpg").write_bytes(BROKEN)
    m = pack(src, tmp_path / "ray", "lmdb", on_error="skip", executor="ray")
    assert [s["path"] for s in m["skipped"]] == ["dog/broken.jpg"] and m["count"] == 18
    pack(src, tmp_path / "local", "lmdb", on_error="skip", workers=2)
    assert_same_pack(tmp_path / "local", tmp_path / "ray")
    with pytest.raises(SourceError, match="broken.jpg: cannot read JPEG header"):
        pack(src, tmp_path / "failed", "wds", executor="ray")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local", "ray", "src"]


def test_cli_and_option_errors(cluster, src, tmp_path, capsys):
    assert main(["pack", str(src), str(tmp_path / "cli"), "--executor", "ray", "--task-cpus", "2",
                 "--format", "wds", "-q"]) == 0
    assert len(records(tmp_path / "cli")) == 3 * 18
    with pytest.raises(OptionError, match="--workers applies to --executor local"):
        pack(src, tmp_path / "x", executor="ray", workers=2)
    with pytest.raises(OptionError, match="--task-cpus 3.0: the Ray cluster has only 2 CPUs"):
        pack(src, tmp_path / "x", executor="ray", task_cpus=3.0)
    with pytest.raises(OptionError, match="--task-cpus 0: must be a positive"):
        pack(src, tmp_path / "x", executor="ray", task_cpus=0)
    with pytest.raises(OptionError, match="--address 127.0.0.1:1: no Ray cluster answers there"):
        pack(src, tmp_path / "x", executor="ray", address="127.0.0.1:1")
    with pytest.raises(OptionError, match="--address applies to --executor ray only"):
        pack(src, tmp_path / "x", address="127.0.0.1:6379")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli"]


def test_killed_driver_leaves_no_manifest(cluster, tmp_path):
    """The driver (a ``pixfeed pack`` joining this cluster) is killed while a task blocks in
    a read held by a FIFO (conftest.held_image): no dataset, no manifest anywhere, and the cluster keeps working."""
    src = make_tree(tmp_path / "src", per_class=2)
    _, fifo, env = held_image(src / "eel")  # Ray's workers read through the hold: HOLD is on their PYTHONPATH
    dst = tmp_path / "ds"
    cmd = [sys.executable, "-m", "pixfeed.cli", "pack", str(src), str(dst), "--executor", "ray",
           "--address", ray.get_runtime_context().gcs_address, "-q"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    fd = _open_when_read(fifo, proc)
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        os.close(fd)  # the orphaned task reads end-of-file and ends
    assert not dst.exists() and not list(tmp_path.rglob("pixfeed.json"))
    assert [p.name for p in tmp_path.iterdir() if ".pixfeed-" in p.name] == [f".ds.pixfeed-tmp-{proc.pid}"]


def _open_when_read(fifo: Path, proc: subprocess.Popen) -> int:
    """The FIFO's write end, once a pack task has opened it to read."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            assert e.errno == errno.ENXIO
            time.sleep(0.05)
    proc.kill()
    pytest.fail(f"the pack never reached the FIFO (exit {proc.poll()}): {proc.communicate()[1]}")


def test_pack_from_and_to_a_bucket(cluster, src, tmp_path, bucket, s3_server):
    """Ray tasks read their slices from the S3 test server and the pack is uploaded there."""
    from test_s3 import upload_tree

    so = s3_server.options
    upload_tree(src, f"{bucket}/train", so)
    opts = {"store": "pixels", "size": 8, "shard_size": 5}
    local = pack(src, tmp_path / "local", "wds", workers=2, **opts)
    both = pack(f"{bucket}/train", f"{bucket}/wds", "wds", executor="ray", storage_options=so, **opts)
    assert both["files"] == local["files"] and both["shards"] == local["shards"]
    assert read_manifest(f"{bucket}/wds", so)["files"] == local["files"]


@pytest.mark.parametrize("fmt,store", [("mmap", "pixels"), ("lmdb", "encoded")])
def test_ray_packs_an_index_with_fields_as_local_does(cluster, tmp_path, fmt, store):
    from fieldtree import FIELDS, make_field_tree

    tree = make_field_tree(tmp_path / "fields", 6)
    index = dict(index=str(tree / "index.jsonl"), field=[f for f in FIELDS[1::2] if ":" in f], per_box="box_cls",
                 **({"size": 16} if store == "pixels" else {}))
    pack(tree, tmp_path / "local", fmt, store=store, workers=2, **index)
    m = pack(tree, tmp_path / "ray", fmt, store=store, executor="ray", **index)
    assert m["count"] == 6 and len(m["schema"]) == 9
    assert_same_pack(tmp_path / "local", tmp_path / "ray")


def test_ray_packs_webdataset_shards_as_local_does(cluster, tmp_path):
    from test_shard_source import writer_shards

    written = writer_shards(tmp_path / "sw")
    src = str(tmp_path / "sw" / "sw-{000000..000002}.tar")
    pack(src, tmp_path / "local", "mmap", store="encoded", workers=2)
    m = pack(src, tmp_path / "ray", "mmap", store="encoded", executor="ray")
    assert m["count"] == len(written) and m["source"]["kind"] == "shards"
    assert_same_pack(tmp_path / "local", tmp_path / "ray")


def test_ray_packs_python_samples_as_local_does(cluster, tmp_path):
    from test_pack_samples import samples_of

    options = dict(inputs=[1, 2, 3], store="encoded", schema={"boxes": "boxes"})
    pixfeed.pack_samples(samples_of, tmp_path / "local", "mmap", workers=2, **options)
    m = pixfeed.pack_samples(samples_of, tmp_path / "ray", "mmap", executor="ray", **options)
    assert m["count"] == 6 and m["source"]["kind"] == "python"
    assert_same_pack(tmp_path / "local", tmp_path / "ray")


def test_pack_samples_runs_fn_as_ray_tasks(cluster, tmp_path):
    """fn runs in Ray's worker processes (not the driver), and a raising fn follows on_error there too."""
    def made_where(n):
        from test_pack_samples import samples_of
        for sample in samples_of(n):
            yield {**sample, "pid": os.getpid()}

    m = pixfeed.pack_samples(made_where, tmp_path / "ray", "mmap", inputs=[1, 2, 3], executor="ray", store="encoded",
                             schema={"boxes": "boxes"})
    ds = pixfeed.open_dataset(tmp_path / "ray", fields=None)
    pids = {int(ds[i]["pid"]) for i in range(len(ds))}
    assert m["count"] == 6 and os.getpid() not in pids

    def fails(n):
        if n == 2:
            raise ValueError("no input 2")
        yield from made_where(n)
    m = pixfeed.pack_samples(fails, tmp_path / "skip", "mmap", inputs=[1, 2, 3], executor="ray", store="encoded",
                             schema={"boxes": "boxes"}, on_error="skip")
    assert m["count"] == 4
