"""Bucket datasets larger than cache_limit, read through the chunk cache (pixfeed.storage.chunked) from the SeaweedFS
server of the object-storage tests: every record once and right, the cache within its limit, chunks fetched
once per node, faults through an HTTP proxy (tests/faultproxy.py), resume, and errors naming the bucket."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import xxhash

from conftest import make_tree
from faultproxy import FaultProxy
from pixfeed.storage import chunkcache, chunkio
from pixfeed.storage.chunked import manifest_entry, parse_bytes
from pixfeed.datasets import open_dataset
from pixfeed.errors import CorruptDataError, DatasetNotFoundError, OptionError, OutputError, StorageError
from pixfeed.loaders import make_loader
from pixfeed.manifest import read_manifest
from pixfeed.packers import pack

CHUNK = 8 << 10  # a ~370 KiB dataset: 46 chunks, 10 of them in a cache of a quarter of it
FAST = {"config_kwargs": {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 2}}}


@pytest.fixture(scope="module")
def packs(tmp_path_factory, s3_server):
    """120 images as mmap pixels, mmap encoded and HDF5 encoded, local and in the bucket."""
    root = tmp_path_factory.mktemp("chunks")
    src = make_tree(root / "src", per_class=40)
    out = {}
    for name, fmt, opts in (("pixels", "mmap", {"size": 32}), ("encoded", "mmap", {"store": "encoded"}),
                            ("hdf5", "hdf5", {})):
        pack(src, root / name, fmt, workers=1, **opts)
        url = f"s3://pixfeed/chunks-{name}"
        pack(src, url, fmt, workers=1, storage_options=s3_server.options, overwrite=True, **opts)
        out[name] = (root / name, url)
    return out


@pytest.fixture
def proxy(s3_server):
    """A FaultProxy in front of the server; ``proxy.options`` are the storage options through it."""
    p = FaultProxy(s3_server.port)
    p.options = {**s3_server.options, "endpoint_url": p.endpoint}
    yield p
    p.close()


def reference(path) -> Counter:
    ds = open_dataset(path, size=16)
    return Counter((ds[i][0].numpy().tobytes(), ds[i][1]) for i in range(len(ds)))


def limit_of(url, options) -> int:
    return sum(m["bytes"] for m in read_manifest(url, options)["files"].values()) // 4


def remote(url, options, tmp_path, **kw):
    return open_dataset(url, size=16, storage_options=options, cache_dir=tmp_path / "cache",
                        cache_limit=limit_of(url, options), chunk_bytes=CHUNK, **kw)


class Sizes(threading.Thread):
    """The largest size of the chunk folder seen while running (sampled every few ms).  A chunk and its
    reservation (``.FILE.K.PID.TID``, renamed to ``FILE.K`` once verified) are the same bytes: a listing
    that races the rename and sees both counts them once."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder, self.most, self.done = folder, 0, False

    def run(self) -> None:
        while not self.done:
            self.sample()
            time.sleep(0.003)

    def sample(self) -> None:
        chunks: dict = {}  # FILE.K: the larger of chunk K and its reservation
        for name, size in chunkio.held(self.folder).items():
            chunk = name[1:].rsplit(".", 2)[0] if name.startswith(".") else name
            chunks[chunk] = max(chunks.get(chunk, 0), size)
        self.most = max(self.most, sum(chunks.values()))

    def __enter__(self) -> "Sizes":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done = True
        self.join()
        self.sample()  # once more: a loaded machine may not have run the thread before a short epoch ended


def epoch(loader) -> Counter:
    return Counter((img.numpy().tobytes(), int(lab)) for images, labels in loader for img, lab in zip(images, labels))


@pytest.mark.parametrize("order, workers", [("random", 0), ("quasi_random", 0), ("random", 2), ("quasi_random", 2)])
def test_epoch_of_4x_the_limit_reads_every_record_once_within_the_limit(packs, s3_server, tmp_path, order, workers):
    local, url = packs["pixels"]
    ds = remote(url, s3_server.options, tmp_path)
    assert ds.chunks is not None and ds.chunks.count >= 20
    loader = make_loader(ds, batch_size=8, num_workers=workers, order=order)
    assert loader.pixfeed_plan.storage == "bucket chunks" and loader.pixfeed_plan.fetch["epoch_bytes"] > 0
    with Sizes(ds.chunks.folder) as sizes:
        got = epoch(loader)
    assert got == reference(local)
    assert 0 < sizes.most <= ds.chunks.limit + CHUNK


@pytest.mark.parametrize("name", ["encoded", "hdf5"])
def test_encoded_mmap_and_hdf5_read_through_chunks(packs, s3_server, tmp_path, name):
    local, url = packs[name]
    ds = remote(url, s3_server.options, tmp_path)
    assert ds.chunks is not None
    with Sizes(ds.chunks.folder) as sizes:
        assert epoch(make_loader(ds, batch_size=8, num_workers=0, order="quasi_random")) == reference(local)
    assert sizes.most <= ds.chunks.limit + CHUNK


def test_quasi_random_fetches_each_chunk_about_once_and_the_forecast_is_right(packs, proxy, tmp_path):
    _, url = packs["pixels"]
    ds = remote(url, proxy.options, tmp_path)
    proxy.gets.clear()  # the hash list of this chunk size was computed on open: one pass
    loader = make_loader(ds, batch_size=8, num_workers=0, order="quasi_random")
    epoch(loader)
    gets, plan = proxy.data_gets("images.npy"), loader.pixfeed_plan.fetch
    assert ds.chunks.count <= gets <= 1.5 * ds.chunks.count
    assert plan["epoch_bytes"] <= 1.5 * plan["data_bytes"]
    assert abs(gets * CHUNK - plan["epoch_bytes"]) <= 0.25 * plan["epoch_bytes"]


RANK = """
import json, sys
import torch.distributed as dist
from pixfeed.datasets import open_dataset
from pixfeed.loaders import make_loader
url, options, cache, limit, chunk, out, rank = sys.argv[1:]
dist.init_process_group("gloo", init_method="file://" + cache + ".pg", rank=int(rank), world_size=2)
ds = open_dataset(url, size=16, storage_options=json.loads(options), cache_dir=cache, cache_limit=int(limit),
                  chunk_bytes=int(chunk))
loader = make_loader(ds, batch_size=4, num_workers=0, order="quasi_random")
got = []
for images, labels in loader:  # in lock step, as a DDP step's all-reduce keeps ranks
    got += [[img.numpy().tobytes().hex(), int(lab)] for img, lab in zip(images, labels)]
    dist.barrier()
json.dump(got, open(out, "w"))
"""


def test_two_ranks_of_a_node_share_the_cache_and_fetch_each_chunk_once(packs, proxy, tmp_path):
    local, url = packs["pixels"]
    count = remote(url, proxy.options, tmp_path).chunks.count  # hashes this chunk size once, as the node would
    proxy.gets.clear()
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, url, json.dumps(proxy.options), str(tmp_path / "cache"),
                               str(limit_of(url, proxy.options)), str(CHUNK), str(tmp_path / f"rank{r}.json"), str(r)])
             for r in range(2)]
    assert [p.wait(timeout=120) for p in ranks] == [0, 0]
    gets = proxy.data_gets("images.npy")
    got = Counter((bytes.fromhex(h), lab) for r in range(2)
                  for h, lab in json.loads((tmp_path / f"rank{r}.json").read_text()))
    assert got == reference(local)  # 120 records split evenly: no padding
    # shared: 55-58 GETs for 46 chunks on a quiet machine (this code and the last release's alike), 70 with a
    # second test suite running beside it (ranks drift apart, and a cache of a quarter of the data evicts what
    # the other rank still needs); a cache per rank fetches each chunk once per rank (2x)
    assert count <= gets <= 1.75 * count, gets


def test_throttling_resets_and_delays_are_retried(packs, proxy, tmp_path):
    local, url = packs["pixels"]
    ds = remote(url, proxy.options, tmp_path)
    proxy.fail(3)
    proxy.drop(2)
    proxy.fail(2, 500)
    proxy.delay = 0.01
    assert epoch(make_loader(ds, batch_size=8, num_workers=0)) == reference(local)
    assert proxy.answered[503] == 3 and proxy.answered[500] == 2 and not proxy.faults


def test_a_server_gone_longer_than_the_timeout_is_a_storage_error_naming_url_and_chunk(packs, proxy, tmp_path):
    _, url = packs["pixels"]
    ds = remote(url, {**proxy.options, **FAST}, tmp_path, storage_timeout=3)
    batches = iter(make_loader(ds, batch_size=8, num_workers=0))
    next(batches)
    proxy.down, start = True, time.monotonic()
    with pytest.raises(StorageError, match=r"images\.npy.*chunk \d+.*gave up after 3 s"):
        for _ in batches:
            pass
    assert time.monotonic() - start < 3 + 8  # the timeout, one request's own timeouts, a fetch in flight


def test_a_flipped_byte_is_refetched_once_then_corrupt_data(packs, proxy, tmp_path):
    local, url = packs["pixels"]
    ds = remote(url, proxy.options, tmp_path)
    proxy.flip(1)
    assert epoch(make_loader(ds, batch_size=8, num_workers=0, io_ahead=0)) == reference(local)
    assert ds.chunks.stats["refetches"] == 1
    fresh = remote(url, proxy.options, tmp_path / "other")
    proxy.flip(2)
    with pytest.raises(CorruptDataError, match=r"images\.npy: its header does not parse"):  # records check chunks
        fresh[0]
    assert not list(fresh.chunks.folder.glob("images.npy.*[0-9]"))


def test_a_failed_chunk_write_keeps_nothing_partial(packs, s3_server, tmp_path, monkeypatch):
    local, url = packs["pixels"]
    ds = remote(url, s3_server.options, tmp_path)

    def full(tmp, data):
        with open(tmp, "r+b") as f:
            f.write(data[:100])
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(chunkio, "write_all", full)
    with pytest.raises(OutputError, match="cannot write chunk 0 .*No space left"):
        ds[0]
    assert list(ds.chunks.folder.iterdir()) == [ds.chunks.folder / "images.npy.0.lock"]
    monkeypatch.undo()
    assert (ds[0][0].numpy().tobytes(), ds[0][1]) in reference(local)


def test_resume_mid_epoch_from_a_bucket_reads_the_rest_once(packs, s3_server, tmp_path):
    local, url = packs["pixels"]
    first = make_loader(remote(url, s3_server.options, tmp_path), batch_size=8, num_workers=0, order="quasi_random")
    it, before = iter(first), Counter()
    for _ in range(6):
        images, labels = next(it)
        before.update((img.numpy().tobytes(), int(lab)) for img, lab in zip(images, labels))
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    again = make_loader(remote(url, s3_server.options, tmp_path), batch_size=8, num_workers=0, order="quasi_random")
    again.load_state_dict(state)
    assert before + epoch(again) == reference(local)


def test_packer_writes_chunk_hashes_and_a_pack_with_them_is_not_hashed_again(packs, s3_server, tmp_path):
    local, url = packs["pixels"]
    m = read_manifest(local)
    data = (local / "images.npy").read_bytes()
    assert m["chunks"]["bytes"] == chunkcache.CHUNK_BYTES
    assert m["chunks"]["xxh3_64"]["images.npy"] == [xxhash.xxh3_64_hexdigest(data[i:i + chunkcache.CHUNK_BYTES])
                                                   for i in range(0, len(data), chunkcache.CHUNK_BYTES)]
    entry = manifest_entry(local, "mmap", CHUNK)["chunks"]
    assert entry["xxh3_64"]["images.npy"][1] == xxhash.xxh3_64_hexdigest(data[CHUNK:2 * CHUNK])
    ds = remote(url, s3_server.options, tmp_path, checksums=False)  # 16 MiB chunks listed, records unchecked: hashed
    assert json.loads((ds.chunks.folder.parent / f"chunks-{CHUNK}.json").read_text()) == entry["xxh3_64"]["images.npy"]


def test_bucket_errors_say_what_is_wrong_with_the_bucket(s3_server):
    with pytest.raises(DatasetNotFoundError, match="the bucket 'no-such-bucket' does not exist"):
        read_manifest("s3://no-such-bucket/ds", s3_server.options)
    with pytest.raises(StorageError, match="access denied .*refused these credentials"):
        read_manifest("s3://pixfeed/ds", {**s3_server.options, "secret": "not-the-secret"})


def test_cache_limit_takes_units_and_refuses_nonsense():
    assert parse_bytes("200GB") == 200 * 10**9 and parse_bytes("512MiB") == 512 << 20 and parse_bytes(7) == 7
    with pytest.raises(OptionError, match="cache_limit='lots'"):
        parse_bytes("lots")


def test_doctor_shows_the_fetch_plan_of_both_orders(packs, s3_server, tmp_path, monkeypatch):
    from pixfeed.storage import chunked
    from pixfeed.diagnose.fetch import check_fetch

    _, url = packs["pixels"]
    monkeypatch.setattr(chunked, "CHUNK_BYTES", CHUNK)
    monkeypatch.setenv("PIXFEED_CACHE", str(tmp_path / "cache"))
    whole = check_fetch(url, s3_server.options, "1GB", 8)
    assert "staged whole" in whole.value and not (tmp_path / "cache").exists()  # nothing copied to say so
    found = check_fetch(url, s3_server.options, limit_of(url, s3_server.options), 8)
    assert found.data["random"]["epoch_bytes"] > found.data["quasi_random"]["epoch_bytes"] >= \
        found.data["quasi_random"]["data_bytes"]
    assert "in a full shuffle" in found.value and "with order='quasi_random'" in found.value and found.status == "warn"


@pytest.mark.parametrize("limited", [True, False])
def test_bench_a_bucket_dataset_reports_get_speed_fetch_plan_and_epochs(packs, s3_server, tmp_path, monkeypatch,
                                                                        capsys, limited):
    from pixfeed.storage import chunked
    from pixfeed.cli import main

    _, url = packs["pixels"]
    monkeypatch.setattr(chunked, "CHUNK_BYTES", CHUNK)
    monkeypatch.setenv("PIXFEED_CACHE", str(tmp_path / "cache"))
    opts = [f"--storage-option={k}={v}" for k, v in s3_server.options.items()]
    limit = ["--cache-limit", str(limit_of(url, s3_server.options))] if limited else []
    assert main(["bench", url, *opts, *limit, "--epochs", "2", "--batch-size", "16", "--workers", "0",
                 "--order", "quasi_random", "--out", str(tmp_path / "out"), "-q"]) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [e["images"] for e in result["epochs"]] == [120, 120]  # every record, each epoch
    assert result["bucket"]["parallel_bytes_per_s"] > 0 and "parallel GETs" in out
    assert s3_server.options["secret"] not in out
    if limited:
        assert result["storage"] == "bucket chunks" and result["fetch"]["epoch_bytes"] >= result["fetch"]["data_bytes"]
        assert "fetch plan: " in out and "x the data file" in out
    else:
        assert result["fetch"] is None and "fetch plan" not in out


def test_bench_options_for_a_url_are_refused_for_a_folder(tmp_path):
    from pixfeed.cli import main

    assert main(["bench", str(tmp_path), "--cache-limit", "1GB", "--out", str(tmp_path / "o")]) == 2
