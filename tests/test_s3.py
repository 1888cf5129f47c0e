"""Datasets in an S3-compatible bucket (a real SeaweedFS server, tests/s3server.py):
pack to, pack from, stream and cache, with the same records and integrity checks as local."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import fail_record_at, make_tree
from pixfeed.storage import cache
from pixfeed.datasets import WdsImageDataset, open_dataset
from pixfeed.errors import CorruptDataError, DatasetNotFoundError, NotOursError, OptionError, SourceError, StorageError
from pixfeed.manifest import read_manifest
from pixfeed.packers import pack
from pixfeed.storage.store import Store

FORMATS = [("mmap", {"size": 16}), ("lmdb", {}), ("hdf5", {"store": "pixels", "size": 12}),
           ("wds", {"shard_size": 4})]


def records(ds) -> list:
    """(image bytes, label) of every record, in reading order (wds: opened with shuffle=False)."""
    samples = ds if isinstance(ds, WdsImageDataset) else (ds[i] for i in range(len(ds)))
    return [(image.numpy().tobytes(), label) for image, label in samples]


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("s3src") / "src")


@pytest.mark.parametrize("fmt, opts", FORMATS)
def test_pack_to_bucket_reads_back_the_local_records(tree, tmp_path, bucket, s3_server, fmt, opts):
    so = s3_server.options
    local = pack(tree, tmp_path / "local", fmt, workers=2, **opts)
    remote = pack(tree, f"{bucket}/ds", fmt, workers=2, storage_options=so, **opts)
    assert remote["files"] == local["files"]
    assert read_manifest(f"{bucket}/ds", so)["files"] == local["files"]
    a = open_dataset(tmp_path / "local", shuffle=False) if fmt == "wds" else open_dataset(tmp_path / "local")
    kw = {"shuffle": False} if fmt == "wds" else {}
    b = open_dataset(f"{bucket}/ds", storage_options=so, cache_dir=tmp_path / "cache", **kw)
    assert records(b) == records(a)
    assert sorted(Store(f"{bucket}/ds", so).list()) == sorted([*local["files"], "pixfeed.json"])


def upload_tree(tree, url, options) -> None:
    store = Store(url, options)
    for p in sorted(tree.rglob("*")):
        if p.is_file():
            store.put(p, p.relative_to(tree).as_posix())


def test_pack_from_bucket_to_local_and_to_bucket(tree, tmp_path, bucket, s3_server):
    so = s3_server.options
    upload_tree(tree, f"{bucket}/train", so)
    Store(f"{bucket}/train", so).write(".hidden/x.jpg", b"not listed")
    local = pack(tree, tmp_path / "ref", "lmdb", workers=2)
    from_bucket = pack(f"{bucket}/train", tmp_path / "got", "lmdb", workers=2, storage_options=so)
    assert from_bucket["files"] == local["files"] and from_bucket["classes"] == local["classes"]
    with pytest.raises(OptionError, match="inside the source"):
        pack(f"{bucket}/train", f"{bucket}/train/packed", "wds", storage_options=so)
    both = pack(f"{bucket}/train", f"{bucket}/wds", "wds", store="pixels", size=8, workers=2, storage_options=so)
    ref = pack(tree, tmp_path / "ref-wds", "wds", store="pixels", size=8, workers=2)
    assert both["files"] == ref["files"]


def test_failed_pack_leaves_no_manifest_and_next_pack_clears_a_killed_one(tree, bucket, s3_server, monkeypatch):
    so, url = s3_server.options, f"{bucket}/ds"
    fail_record_at(monkeypatch, 9)
    with pytest.raises(RuntimeError, match="disk on fire"):
        pack(tree, url, "wds", shard_size=2, shuffle=False, workers=1, storage_options=so)
    assert Store(url, so).list() == {}  # what it had uploaded (shards 0-3) was removed
    monkeypatch.undo()  # the real record loader again
    planted = Store(url, so)  # what a killed pack leaves, the marker and some shards, as anyone could write it
    planted.write(".pixfeed-packing", b"")
    planted.write("shard-000007.tar", b"half")
    with pytest.raises(DatasetNotFoundError, match="no pixfeed.json"):
        open_dataset(url, storage_options=so)
    with pytest.raises(NotOursError, match="no record of"):  # no proof pixfeed wrote them: nothing deleted
        pack(tree, url, "wds", shard_size=4, storage_options=so)
    assert planted.list() == {".pixfeed-packing": 0, "shard-000007.tar": 4}
    # a pack really killed midway is cleared: tests/test_hostile_publish.py


def test_overwrite_rules_match_local_folders(tree, bucket, s3_server):
    so, url = s3_server.options, f"{bucket}/ds"
    pack(tree, url, "lmdb", storage_options=so)
    with pytest.raises(OptionError, match="--overwrite"):
        pack(tree, url, "lmdb", storage_options=so)
    m = pack(tree, url, "mmap", size=8, overwrite=True, storage_options=so)
    assert sorted(Store(url, so).list()) == sorted([*m["files"], "pixfeed.json"])
    Store(f"{bucket}/other", so).write("notes.txt", b"mine")
    with pytest.raises(OptionError, match="no pixfeed dataset"):
        pack(tree, f"{bucket}/other", "lmdb", overwrite=True, storage_options=so)
    assert Store(f"{bucket}/other", so).list() == {"notes.txt": 4}


def flip_byte(url, name, options, at=600) -> None:
    store = Store(url, options)
    data = bytearray(store.read(name))
    data[at] ^= 0x01
    store.write(name, bytes(data))


def test_flipped_byte_in_bucket_is_found_by_verify_and_readers(tree, tmp_path, bucket, s3_server):
    from pixfeed.verify.check import verify

    so = s3_server.options
    pack(tree, f"{bucket}/wds", "wds", shard_size=4, shuffle=False, storage_options=so)
    pack(tree, f"{bucket}/mmap", "mmap", size=8, storage_options=so)
    assert verify(f"{bucket}/wds", storage_options=so).ok
    flip_byte(f"{bucket}/wds", "shard-000001.tar", so)
    flip_byte(f"{bucket}/mmap", "images.npy", so)
    report = verify(f"{bucket}/wds", storage_options=so)
    assert any("shard-000001.tar: xxh3_64" in p and p.startswith("s3://") for p in report.problems)
    with pytest.raises(CorruptDataError, match="shard-000001.tar"):
        list(WdsImageDataset(f"{bucket}/wds", shuffle=False, storage_options=so))
    with pytest.raises(CorruptDataError, match=r"s3://.*/mmap/images.npy: downloaded bytes fail"):
        open_dataset(f"{bucket}/mmap", storage_options=so, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*/images.npy*"))  # nothing half-used left in the cache


def test_deleted_shard_is_a_clear_error(tree, bucket, s3_server):
    so, url = s3_server.options, f"{bucket}/wds"
    pack(tree, url, "wds", shard_size=4, storage_options=so)
    Store(url, so).remove(["shard-000002.tar"])
    with pytest.raises(DatasetNotFoundError, match=r"s3://.*shard-000002.tar: data file missing"):
        list(WdsImageDataset(url, storage_options=so))


def test_bad_credentials_give_a_clear_error_without_the_secret(tree, bucket, s3_server, monkeypatch, capsys):
    from pixfeed.cli import main

    secret = "do-not-print-this-s3cr3t"
    bad = {**s3_server.options, "secret": secret}
    with pytest.raises(StorageError, match="access denied") as e:
        read_manifest(f"{bucket}/x", bad)
    assert secret not in str(e.value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    assert main(["pack", str(tree), f"{bucket}/x", "-q"]) == 2
    err = capsys.readouterr().err
    assert "access denied" in err and secret not in err and f"{bucket}/x" in err


def test_cli_pack_info_verify_on_urls(tree, bucket, s3_server, monkeypatch, capsys):
    from pixfeed.cli import main

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.options["secret"])
    opt = f"--storage-option=endpoint_url={s3_server.endpoint}"
    assert main(["pack", "--format", "wds", str(tree), f"{bucket}/ds", "-q", opt]) == 0
    assert main(["info", f"{bucket}/ds", opt]) == 0
    assert "records   12" in capsys.readouterr().out
    assert main(["verify", f"{bucket}/ds", opt]) == 0
    assert "OK" in capsys.readouterr().out


STAGE = """
import json, sys
from pixfeed.storage import cache
from pixfeed.manifest import read_manifest
real = cache._download
cache._download = lambda *args: print("downloading", flush=True) or real(*args)
url, options, where = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
print(cache.stage(url, read_manifest(url, options), options, where))
"""


def test_cache_downloads_once_for_eight_processes_resumes_and_evicts(tree, tmp_path, bucket, s3_server):
    import subprocess
    import sys

    so, url, where = s3_server.options, f"{bucket}/lmdb", tmp_path / "cache"
    pack(tree, url, "lmdb", storage_options=so)
    ranks = [subprocess.Popen([sys.executable, "-c", STAGE, url, json.dumps(so), str(where)],
                              stdout=subprocess.PIPE, text=True) for _ in range(8)]  # as 8 ranks starting at once
    outputs = [rank.communicate(timeout=120)[0].split() for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks)
    assert sum(out.count("downloading") for out in outputs) == 1 and len({out[-1] for out in outputs}) == 1
    folder = Path(outputs[0][-1])
    # an interrupted download: one file finished, one half-written .part, no manifest -> only the rest is fetched
    (folder / "pixfeed.json").unlink()
    (folder / "data.mdb").rename(folder / "data.mdb.part")
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.name != "data.mdb.part"}
    ds = open_dataset(url, storage_options=so, cache_dir=where)
    assert ds.path == folder and ds[0][0].shape[0] == 3
    assert all(folder.joinpath(n).stat().st_mtime_ns == t for n, t in before.items())  # finished files kept
    # a changed remote dataset gets its own copy; the limit evicts the least recently used copy not in use
    pack(tree, url, "lmdb", max_side=16, overwrite=True, storage_options=so)
    cache._HELD.pop(folder).close()
    newer = cache.stage(url, read_manifest(url, so), so, where, cache_limit=1)
    assert newer != folder and (newer / "pixfeed.json").is_file() and not folder.exists()


def test_dead_endpoint_is_an_error_not_a_hang(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    options = {"key": "k", "secret": "s3cr3t-value", "endpoint_url": f"http://127.0.0.1:{port}",
               "config_kwargs": {"retries": {"max_attempts": 1}}}  # the default 3 attempts take ~30 s
    with pytest.raises(StorageError, match=rf"s3://pixfeed/x/pixfeed.json: storage request failed .*{port}"):
        open_dataset("s3://pixfeed/x", storage_options=options)


def test_doctor_measures_a_bucket(tree, bucket, s3_server, capsys):
    from pixfeed.cli import main

    pack(tree, f"{bucket}/wds", "wds", shard_size=4, storage_options=s3_server.options)
    opts = [f"--storage-option={k}={v}" for k, v in s3_server.options.items()]
    assert main(["doctor", f"{bucket}/wds", "--json", *opts]) == 0
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)}["storage"]
    data = found["data"]
    assert data["latency_s"] > 0 and data["parallel_bytes_per_s"] > 0 and data["bytes_per_record"] > 0
    assert "shards at once" in found["advice"] and s3_server.options["secret"] not in found["value"]


def test_server_lost_mid_pack_leaves_no_manifest_and_the_next_pack_recovers(tree, bucket, s3_server, monkeypatch):
    from pixfeed.packers import tasks
    from s3server import CutProxy

    proxy, url = CutProxy(s3_server.port), f"{bucket}/ds"
    dying = {**s3_server.options, "endpoint_url": f"http://127.0.0.1:{proxy.port}",
             "config_kwargs": {"retries": {"max_attempts": 1}}}  # fail fast once it is gone
    real = tasks.load_record

    def cutting(source, i, *rest):
        if i == 8:
            proxy.cut()  # from here on the server is unreachable for the pack
        return real(source, i, *rest)

    monkeypatch.setattr(tasks, "load_record", cutting)
    with pytest.raises(StorageError, match=f"{url}/"):
        pack(tree, url, "wds", shard_size=2, shuffle=False, workers=1, storage_options=dying)
    monkeypatch.undo()  # the real record loader again
    so = s3_server.options
    left = Store(url, so).list()
    assert "pixfeed.json" not in left and ".pixfeed-packing" in left  # the marker: a killed pack's leftovers
    Store(url, so).write("shard-000003.tar", b"half an upload")
    m = pack(tree, url, "wds", shard_size=5, storage_options=so)
    assert sorted(Store(url, so).list()) == sorted([*m["files"], "pixfeed.json"])


def test_pack_an_index_and_its_images_from_a_bucket(tmp_path, bucket, s3_server):
    from fieldtree import FIELDS, make_field_tree

    so = s3_server.options
    tree = make_field_tree(tmp_path / "fields", 4)
    upload_tree(tree, f"{bucket}/src", so)
    fields = dict(field=[f for f in FIELDS[1::2] if ":" in f], per_box="box_cls")
    local = pack(tree, tmp_path / "local", "lmdb", workers=2, index=str(tree / "index.csv"), **fields)
    remote = pack(f"{bucket}/src", tmp_path / "remote", "lmdb", workers=2, storage_options=so,
                  index=f"{bucket}/src/index.csv", **fields)
    assert remote["files"] == local["files"] and remote["schema"] == local["schema"]
    with pytest.raises(SourceError, match=r"--index s3://.*/nope\.csv: cannot read"):
        pack(f"{bucket}/src", tmp_path / "none", "lmdb", storage_options=so, index=f"{bucket}/src/nope.csv")
