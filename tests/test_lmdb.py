"""The LMDB format's own checks: plain-lmdb interop, map growth, a damaged header
(shared behaviour with hdf5: test_single_writer.py)."""
from __future__ import annotations

import json
import logging
import struct

import lmdb
import pytest

import pixfeed.packers.lmdb as lmdb_writer
from pixfeed.datasets import LmdbImageDataset
from pixfeed.errors import CorruptDataError, OutputError
from pixfeed.packers import pack
from pixfeed.sources.folder import scan


def test_plain_lmdb_reads_documented_layout(image_tree, tmp_path):
    pack(image_tree, tmp_path / "out", "lmdb", workers=2)
    source = scan(image_tree)
    env = lmdb.open(str(tmp_path / "out" / "data.mdb"), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        value = txn.get(b"0000000005")
        meta = json.loads(txn.get(b"__pixfeed__"))
        keys = [k for k, _ in txn.cursor()]
    env.close()
    magic, version, kind, _, label, _, h, w, n = struct.unpack_from("<4sBBHqQIIQ", value)
    assert (magic, version, label, n) == (b"PXFR", 2, source.labels[5], len(value) - 40 - 4)
    assert kind in (1, 2) and value[40:40 + n] == (image_tree / source.paths[5]).read_bytes()
    assert value[40 + n:] == b"\x00\x00\x00\x00"  # the field table: no fields
    assert meta["count"] == len(source) and meta["classes"] == source.classes
    assert keys == [b"%010d" % i for i in range(len(source))] + [b"__pixfeed__"]


def test_map_grows_from_a_tiny_estimate(image_tree, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(lmdb_writer, "initial_map_size", lambda count, stored: 32 << 10)
    caplog.set_level(logging.DEBUG, logger="pixfeed.packers.lmdb")
    m = pack(image_tree, tmp_path / "out", "lmdb", store="pixels", size=64, workers=2)
    assert "map full" in caplog.text
    stored = m["stats"]["stored_bytes"]
    assert stored > 32 << 10 and m["files"]["data.mdb"]["bytes"] < 2 * stored + (256 << 10)
    ds = LmdbImageDataset(tmp_path / "out")
    assert [ds[i][1] for i in range(len(ds))] == list(scan(image_tree).labels)


def test_damaged_header_names_lmdb_key(image_tree, tmp_path):
    pack(image_tree, tmp_path / "out", "lmdb", workers=2)
    env = lmdb.open(str(tmp_path / "out" / "data.mdb"), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        header = txn.get(b"0000000003")[:40]
    env.close()
    data = (tmp_path / "out" / "data.mdb").read_bytes()
    assert data.count(header) == 1
    (tmp_path / "out" / "data.mdb").write_bytes(data.replace(header, header[:4] + b"\x09" + header[5:]))
    with pytest.raises(CorruptDataError, match=r"record 3 .*key 0000000003: malformed record: record version 9"):
        LmdbImageDataset(tmp_path / "out", checksums=False)[3]


class FailingEnv:
    """An LMDB environment whose write transactions fail as on a full disk."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def begin(self, **kwargs):
        raise lmdb.Error("mdb_txn_commit: Input/output error")


def test_lmdb_write_failure_is_an_output_error(image_tree, tmp_path, monkeypatch):
    real_open = lmdb.open
    monkeypatch.setattr(lmdb, "open", lambda *args, **kwargs: FailingEnv(real_open(*args, **kwargs)))
    dst = tmp_path / "out"
    with pytest.raises(OutputError, match=f"cannot write the dataset {dst}: LMDB write failed: "
                                          r"mdb_txn_commit: Input/output error \(.*data.mdb\); nothing was written"):
        pack(image_tree, dst, "lmdb", store="pixels", size=16, workers=1)
    assert list(tmp_path.iterdir()) == [image_tree]


@pytest.mark.parametrize("store", ["encoded", "pixels"])
def test_values_are_staged_whole_and_put_as_views_of_the_part(image_tree, tmp_path, monkeypatch, store):
    """The workers stage each record's whole value (header, stored bytes, field table); the main
    process puts views of the staged part file, neither reading them into bytes nor joining them."""
    put, real = [], lmdb_writer._commit

    def commit(env, batch):
        put.extend(type(value) for _, value in batch)
        real(env, batch)

    monkeypatch.setattr(lmdb_writer, "_commit", commit)
    pack(image_tree, tmp_path / "out", "lmdb", store=store, workers=2, **({"size": 32} if store == "pixels" else {}))
    assert put[:-1] and set(put[:-1]) == {memoryview} and put[-1] is bytes  # the last: the meta key
    ds = LmdbImageDataset(tmp_path / "out")
    for i in range(len(ds)):
        ds[i]  # every checksum matches


def test_a_repack_reads_views_of_the_map_in_one_transaction_and_checks_them(image_tree, tmp_path):
    """``iter_verified`` (a repack's reads) yields encoded records as views of LMDB's map, not copies,
    each checked against its checksum before it is yielded; a flipped byte is named, never passed on."""
    pack(image_tree, tmp_path / "out", "lmdb", workers=1)
    ds, source = LmdbImageDataset(tmp_path / "out"), scan(image_tree)
    seen = []
    for i, data, checksum in ds.iter_verified(range(len(ds)), block=4):
        assert isinstance(data, memoryview) and data.obj is None  # LMDB's memory, not a bytes object
        seen.append((i, bytes(data), int(checksum)))
    _, stored, _, sums = ds.read_verified(range(len(ds)))
    assert seen == [(i, bytes(s), int(c)) for i, (s, c) in enumerate(zip(stored, sums))]
    assert seen[5][1] == (image_tree / source.paths[5]).read_bytes()
    path = tmp_path / "out" / "data.mdb"
    raw = bytearray(path.read_bytes())
    at = raw.find(seen[5][1]) + len(seen[5][1]) // 2
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    ds = LmdbImageDataset(tmp_path / "out")
    with pytest.raises(CorruptDataError, match=r"record 5 .*fail their xxh3_64 checksum"):
        for _ in ds.iter_verified(range(len(ds))):
            pass


def test_whether_the_dataset_fits_is_asked_once_per_unmap_interval(image_tree, tmp_path, monkeypatch):
    """Past ``UNMAP_EVERY`` bytes the reader asks whether the dataset fits in the page cache (which
    reads /proc and the cgroup's files) once, then counts again; it asked on every read after."""
    import pixfeed.datasets.lmdb as lmdb_reader

    pack(image_tree, tmp_path / "out", "lmdb", workers=1)
    asked = []
    monkeypatch.setattr(lmdb_reader, "fits_in_page_cache", lambda nbytes: asked.append(nbytes) or True)
    monkeypatch.setattr(lmdb_reader, "UNMAP_EVERY", 3000)
    ds = LmdbImageDataset(tmp_path / "out")
    total = sum(len(ds.read_checked([i])[1][0]) for i in list(range(len(ds))) * 4)
    assert 0 < len(asked) <= total // 3000
