"""The WebDataset format: tar shards, their bounds and keys, and the splitting IterableDataset."""
from __future__ import annotations

import io
import itertools
import json
import os
import pickle
import subprocess
import tarfile
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import webdataset
from conftest import make_tree, write_image, sized
from PIL import Image
from webdataset.tariterators import base_plus_ext

from pixfeed.checksum import file_hash, record_hash
from pixfeed.datasets import MmapImageDataset, WdsImageDataset, open_dataset
from pixfeed.datasets import wds as wds_reader
from pixfeed.errors import CorruptDataError, DatasetNotFoundError, ImageDecodeError, OptionError
from pixfeed.loaders import make_loader
from pixfeed.manifest import read_manifest
from pixfeed.packers import pack
from pixfeed.packers.wds import add_member
from pixfeed.sources.folder import scan


class Indexed(WdsImageDataset):
    """Yields ``(record index, (image, label))`` so tests can tell samples apart."""

    def sample(self, stored, label, i):
        return i, super().sample(stored, label, i)


class IndexOnly(WdsImageDataset):
    """Yields the record index only (no decoding): for the splitting tests."""

    def sample(self, stored, label, i):
        return i


def members(path) -> list:
    return subprocess.run(["tar", "-tf", str(path)], capture_output=True, text=True, check=True).stdout.split()


def shard_paths(root) -> list:
    return [root / s["name"] for s in read_manifest(root)["shards"]]


def as_worker(monkeypatch, worker: int, workers: int) -> None:
    """Make the reader believe it runs in DataLoader worker ``worker`` of ``workers``."""
    info = SimpleNamespace(id=worker, num_workers=workers)
    monkeypatch.setattr(wds_reader, "get_worker_info", lambda: info)


@pytest.mark.parametrize("store", ["encoded", "pixels"])
def test_round_trip_matches_mmap(image_tree, tmp_path, store):
    pack(image_tree, tmp_path / "wds", "wds", workers=2, store=store, **sized(store, 24), shard_size=5)
    pack(image_tree, tmp_path / "mmap", "mmap", workers=2, store=store, **sized(store, 24))
    ds, ref = open_dataset(tmp_path / "wds"), MmapImageDataset(tmp_path / "mmap")
    assert isinstance(ds, WdsImageDataset) and len(ds) == len(ref) == 12
    got = {ds.key(i): (label, img) for i, (img, label) in Indexed(tmp_path / "wds")}
    with tarfile.open(shard_paths(tmp_path / "wds")[0]) as tar:
        meta = json.load(tar.extractfile(next(n for n in tar.getnames() if n.endswith(".json"))))
    source = scan(image_tree)
    source_size = Image.open(image_tree / source.paths[source.keys.index(meta["key"])]).size
    assert meta["size"] == list(source_size[::-1])  # the source's (H, W), also when stored resized
    assert sorted(got) == sorted(ref.key(i) for i in range(len(ref)))
    for i in range(len(ref)):
        img, label = ref[i]
        assert got[ref.key(i)][0] == label and torch.equal(got[ref.key(i)][1], img), ref.key(i)


def test_members_and_manifest(image_tree, tmp_path):
    m = pack(image_tree, tmp_path / "d", "wds", workers=2, shard_size=5, shuffle=False)
    assert [s["count"] for s in m["shards"]] == [5, 5, 2]
    for s in m["shards"]:
        assert m["files"][s["name"]] == {"bytes": s["bytes"], "xxh3_64": s["xxh3_64"]}
    source = scan(image_tree)
    names = members(tmp_path / "d" / "shard-000000.tar")
    formats = ["jpg", "png", "jpg", "png", "jpg"]  # make_tree: jpg, png, jpg(L), png(RGBA), JPEG
    assert names == [f"{k.replace('/', '__')}.{ext}" for k, f in zip(source.keys, formats)
                     for ext in (f, "cls", "json")]
    with tarfile.open(tmp_path / "d" / "shard-000000.tar") as tar:
        info = tar.getmembers()[0]
        assert (info.mtime, info.uid, info.gid, info.mode, info.uname) == (0, 0, 0, 0o444, "")
        meta = json.load(tar.extractfile("cat__img0.json"))
        assert tar.extractfile("cat__img0.cls").read() == b"0"
        image = tar.extractfile("cat__img0.jpg").read()
    assert image == (image_tree / "cat" / "img0.jpg").read_bytes()
    assert meta == {"key": "cat/img0", "label": 0, "class": "cat", "size": [36, 48], "index": 0,
                    "xxh3_64": f"{record_hash(image):016x}"}


def test_no_shuffle_keeps_source_order_and_shuffle_is_seeded(image_tree, tmp_path):
    keys = scan(image_tree).keys
    pack(image_tree, tmp_path / "plain", "wds", workers=2, shuffle=False, shard_size=4)
    assert json.loads((tmp_path / "plain" / "keys.json").read_text()) == keys
    ds = IndexOnly(tmp_path / "plain", shuffle=False)
    assert list(ds) == list(range(12))
    orders = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        pack(image_tree, tmp_path / name, "wds", workers=2, seed=seed, shard_size=4)
        orders.append(json.loads((tmp_path / name / "keys.json").read_text()))
    assert orders[0] == orders[1] != orders[2] and orders[0] != keys and sorted(orders[0]) == sorted(keys)


@pytest.mark.parametrize("store", ["encoded", "pixels"])
def test_shard_bytes_bound(image_tree, tmp_path, store):
    m = pack(image_tree, tmp_path / "d", "wds", workers=2, store=store, **sized(store, 16), shard_bytes=20480)
    assert len(m["shards"]) > 1 and sum(s["count"] for s in m["shards"]) == 12
    assert all(p.stat().st_size <= 20480 for p in shard_paths(tmp_path / "d"))
    m = pack(image_tree, tmp_path / "e", "wds", workers=2, shard_bytes=10 ** 6, shard_size=3)
    assert [s["count"] for s in m["shards"]] == [3, 3, 3, 3]


@pytest.mark.parametrize("option, value", [("shard_size", 0), ("shard_bytes", 5000)])
def test_bad_shard_bounds_name_the_option(image_tree, tmp_path, option, value):
    with pytest.raises(OptionError, match=f"--{option.replace('_', '-')} {value}"):
        pack(image_tree, tmp_path / "d", "wds", **{option: value})
    assert not (tmp_path / "d").exists()


def test_awkward_keys_survive_and_stay_unique(tmp_path):
    src = tmp_path / "src"
    for rel in ["c.1/a.b.jpg", "c.1/a_b.jpg", "c.1/my photo.png", "c.1/a.png", "c.1/a.jpg",
                "zé/café.jpg", "zé/deep/er/x.y.z.png", f"zé/{'long' * 30}.jpg"]:
        write_image(src / rel, seed=len(rel))
    m = pack(src, tmp_path / "d", "wds", workers=2, shard_bytes=3 * 10240)
    assert all(p.stat().st_size <= 3 * 10240 for p in shard_paths(tmp_path / "d"))
    names = [n for p in shard_paths(tmp_path / "d") for n in members(p)]
    bases = [base_plus_ext(n)[0] for n in names if n.endswith(".json")]
    assert len(bases) == len(set(bases)) == 8
    assert all("." not in b and "/" not in b for b in bases)
    assert {"c_1__a_b", "c_1__a_b-1", "c_1__my_photo", "zé__café", "zé__deep__er__x_y_z"} <= set(bases)
    ds = Indexed(tmp_path / "d")
    assert sorted(ds.key(i) for i, _ in ds) == sorted(scan(src).keys) and m["count"] == 8


def test_stock_webdataset_reads_the_shards(image_tree, tmp_path):
    pack(image_tree, tmp_path / "d", "wds", workers=2, shard_size=5)
    pack(image_tree, tmp_path / "m", "mmap", workers=2, store="encoded")
    ref = MmapImageDataset(tmp_path / "m")
    by_key = {ref.key(i).replace("/", "__"): ref[i] for i in range(len(ref))}
    urls = [str(p) for p in shard_paths(tmp_path / "d")]
    samples = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8"))
    assert len(samples) == 12
    for s in samples:
        img, label = by_key[s["__key__"]]
        assert s["cls"] == label == s["json"]["label"]
        assert np.array_equal(s.get("jpg", s.get("png")), img.permute(1, 2, 0).numpy())


@pytest.mark.parametrize("shard_size", [2, 12])  # 6 shards; 1 shard, fewer than workers
def test_dataloader_workers_see_every_sample_once(image_tree, tmp_path, shard_size):
    pack(image_tree, tmp_path / "d", "wds", workers=2, shard_size=shard_size)
    ds = IndexOnly(tmp_path / "d")
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert sorted(int(i) for i in loader) == list(range(12))


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_persistent_workers_see_set_epoch(image_tree, tmp_path, start):
    """make_loader keeps wds workers between epochs; each epoch is still the one set in the main process."""
    pack(image_tree, tmp_path / "d", "wds", workers=2, shard_size=3)
    loader = make_loader(IndexOnly(tmp_path / "d"), 1, shuffle=True, num_workers=2)
    assert loader.persistent_workers and loader.pixfeed_plan.persistent_workers
    loader.multiprocessing_context = start
    fresh = torch.utils.data.DataLoader(IndexOnly(tmp_path / "d"), batch_size=None, num_workers=2)
    epochs = []
    for epoch in (0, 1, 1, 5):
        loader.set_epoch(epoch)
        fresh.dataset.set_epoch(epoch)
        got = [int(i) for i, in loader]
        assert got == [int(i) for i in fresh], f"epoch {epoch}"
        epochs.append(got)
    assert epochs[0] != epochs[1] == epochs[2] != epochs[3] and sorted(epochs[3]) == list(range(12))
    copy = pickle.loads(pickle.dumps(fresh.dataset))  # a plain pickle takes the value, not the memory
    copy.set_epoch(9)
    assert copy.epoch == 9 and fresh.dataset.epoch == 5


def test_a_worker_with_nothing_ends(tmp_path):
    write_image(tmp_path / "one" / "a.png")
    pack(tmp_path / "one", tmp_path / "d", "wds", workers=1)
    loader = torch.utils.data.DataLoader(IndexOnly(tmp_path / "d"), batch_size=None, num_workers=2, timeout=60)
    assert [int(i) for i in loader] == [0]


def test_ranks_get_equal_counts_with_few_shards(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for i in range(11):
        write_image(src / f"{i:02d}.png", size=(8, 8), seed=i)
    pack(src, tmp_path / "d", "wds", workers=2, shard_size=5)  # 3 shards (5, 5, 1) for 2 ranks x 2 workers
    seen = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rank, worker in itertools.product(range(2), range(2)):
            as_worker(monkeypatch, worker, 2)
            seen[rank, worker] = list(IndexOnly(tmp_path / "d", rank=rank, world_size=2, shuffle=False))
    assert len(caught) == 1 and "every worker reads them all" in str(caught[0].message)  # once per process
    per_rank = [seen[r, 0] + seen[r, 1] for r in range(2)]
    assert [len(x) for x in per_rank] == [5, 5] == [len(IndexOnly(tmp_path / "d", rank=1, world_size=2))] * 2
    everything = per_rank[0] + per_rank[1]
    assert sorted(everything) == list(range(10))  # each once; the stream's last N % world = 1 left out


def test_rank_with_real_workers(tmp_path):
    src = tmp_path / "src"
    for i in range(11):
        write_image(src / f"{i:02d}.png", size=(8, 8), seed=i)
    pack(src, tmp_path / "d", "wds", workers=2, shard_size=2)
    got = []
    for rank in range(2):
        ds = IndexOnly(tmp_path / "d", rank=rank, world_size=2)
        got.append([int(i) for i in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)])
    assert [len(g) for g in got] == [5, 5] and len(set(got[0] + got[1])) == 10


def test_bad_rank_options(image_tree, tmp_path):
    pack(image_tree, tmp_path / "d", "wds", workers=2)
    for kwargs in ({"rank": 2, "world_size": 2}, {"rank": 0}, {"buffer": -1}):
        with pytest.raises(OptionError):
            WdsImageDataset(tmp_path / "d", **kwargs)
    with pytest.raises(OptionError, match="not a list of shard URLs"):
        WdsImageDataset([str(tmp_path / "d" / "shard-000000.tar")])


def test_set_epoch_changes_order_and_seed_repeats_it(image_tree, tmp_path):
    pack(image_tree, tmp_path / "d", "wds", workers=2, shard_size=3)

    def order(epoch, seed=0, buffer=1000):
        ds = IndexOnly(tmp_path / "d", seed=seed, buffer=buffer)
        ds.set_epoch(epoch)
        return list(ds)

    assert order(0) == order(0) != order(1) and order(1) == order(1) != order(0, seed=5)
    assert sorted(order(3)) == list(range(12))
    assert order(0, buffer=0) != order(1, buffer=0)  # the shard order alone changes too


def test_pickles_before_and_after_reading(image_tree, tmp_path):
    pack(image_tree, tmp_path / "d", "wds", workers=2, shard_size=5)
    ds = WdsImageDataset(tmp_path / "d", shuffle=False)
    before = pickle.loads(pickle.dumps(ds))
    first = list(ds)
    after = pickle.loads(pickle.dumps(ds))
    assert after._handle is None
    for copy in (before, after):
        assert all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(copy, first, strict=True))


@pytest.fixture
def packed(image_tree, tmp_path):
    pack(image_tree, tmp_path / "d", "wds", workers=2, shard_size=5, shuffle=False)
    return tmp_path / "d"


def test_damaged_member_names_shard_and_key(packed):
    shard = packed / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    with tarfile.open(shard) as tar:
        info = tar.getmember("dog__img1.png")
    data[info.offset_data + info.size // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match=r"record 5 \(key 'dog/img1'\) in shard shard-000001.tar.*checksum"):
        list(WdsImageDataset(packed, shuffle=False))
    with pytest.raises(ImageDecodeError, match=r"record 5 \(key 'dog/img1'\) in shard shard-000001.tar"):
        list(WdsImageDataset(packed, shuffle=False, checksums=False))  # unchecked, the decoder finds it


def test_truncated_and_missing_shards_name_the_shard(packed):
    shard = packed / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:5000])
    with pytest.raises(CorruptDataError, match="shard-000001.tar: 5000 bytes"):
        list(WdsImageDataset(packed))
    shard.unlink()
    with pytest.raises(DatasetNotFoundError, match="shard-000001.tar: data file missing"):
        list(WdsImageDataset(packed))


def rewrite_shard(root, name, edit) -> None:
    """Rewrite shard ``name`` through ``edit(member, data) -> data or None``; keep the manifest's size right."""
    path, out = root / name, root / "rewritten.tar"
    with tarfile.open(path) as src, tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as dst:
        for info in src:
            data = edit(info.name, src.extractfile(info).read())
            if data is not None:
                add_member(dst, info.name, data)
    out.replace(path)
    manifest = json.loads((root / "pixfeed.json").read_text())
    manifest["files"][name]["bytes"] = path.stat().st_size
    (root / "pixfeed.json").write_text(json.dumps(manifest))


def test_missing_members_name_shard_and_key(packed):
    rewrite_shard(packed, "shard-000000.tar", lambda n, d: None if n == "cat__img2.jpg" else d)
    with pytest.raises(CorruptDataError, match=r"shard-000000.tar: member key 'cat__img2' \(record 2\): no .jpg"):
        list(WdsImageDataset(packed, shuffle=False))
    rewrite_shard(packed, "shard-000000.tar", lambda n, d: None if n.startswith("cat__img2") else d)
    with pytest.raises(CorruptDataError, match="shard-000000.tar: member key 'cat__img3'.*says record 3"):
        list(WdsImageDataset(packed, shuffle=False))
    rewrite_shard(packed, "shard-000001.tar", lambda n, d: None if n.startswith("eel__img1") else d)
    with pytest.raises(CorruptDataError, match="shard-000001.tar: ends after 4 samples .*records 5"):
        list(WdsImageDataset(packed, shuffle=False, rank=1, world_size=2))


def test_pixels_npy_is_never_unpickled(image_tree, tmp_path):
    pack(image_tree, tmp_path / "d", "wds", workers=2, store="pixels", size=8, shuffle=False)
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    rewrite_shard(tmp_path / "d", "shard-000000.tar", lambda n, d: buf.getvalue() if n == "cat__img0.npy" else d)
    with pytest.raises(CorruptDataError, match="cat__img0.*npy member cannot be read"):
        list(WdsImageDataset(tmp_path / "d", shuffle=False, checksums=False))


def test_skipped_images_keep_indices_consistent(tmp_path):
    src = make_tree(tmp_path / "src")
    for name in ("img0.jpg", "img1.png", "img2.jpg"):  # all of shard 0, half of shard 1
        (src / "cat" / name).write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    m = pack(src, tmp_path / "d", "wds", workers=2, shard_size=2, shuffle=False, on_error="skip")
    assert [(s["name"], s["count"]) for s in m["shards"]][:2] == [("shard-000001.tar", 1), ("shard-000002.tar", 2)]
    assert not (tmp_path / "d" / "shard-000000.tar").exists() and m["count"] == 9
    keys = json.loads((tmp_path / "d" / "keys.json").read_text())
    for p in shard_paths(tmp_path / "d"):
        with tarfile.open(p) as tar:
            for info in tar:
                if info.name.endswith(".json"):
                    meta = json.load(tar.extractfile(info))
                    assert keys[meta["index"]] == meta["key"]
    assert sorted(i for i, _ in Indexed(tmp_path / "d")) == list(range(9))
    for name, meta in m["files"].items():  # renumbered, joined and untouched shards alike
        assert meta["xxh3_64"] == file_hash(tmp_path / "d" / name), name


@pytest.mark.parametrize("store", ["encoded", "pixels"])
def test_shards_written_in_pieces_equal_one_tarfile(image_tree, tmp_path, store):
    """One shard for 2 workers is packed as pieces and joined: the same bytes as one TarFile writing it."""
    m = pack(image_tree, tmp_path / "d", "wds", workers=2, store=store, **sized(store, 8))
    assert [s["name"] for s in m["shards"]] == ["shard-000000.tar"]
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["keys.json", "keys.offsets.npy", "keys.utf8",
                                                               "pixfeed.json", "shard-000000.tar"]
    shard = tmp_path / "d" / "shard-000000.tar"
    assert shard.read_bytes() == as_one_tarfile(shard)
    assert len(list(Indexed(tmp_path / "d"))) == len(scan(image_tree))


def as_one_tarfile(shard) -> bytes:
    """The bytes of one TarFile writing ``shard``'s members (its .npy members as np.save writes them)."""
    buf = io.BytesIO()
    with tarfile.open(shard) as src, tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for info in src:
            data = src.extractfile(info).read()
            if info.name.endswith(".npy"):
                want = io.BytesIO()
                np.save(want, np.load(io.BytesIO(data), allow_pickle=False), allow_pickle=False)
                assert data == want.getvalue()
            add_member(dst, info.name, data)
    assert len(buf.getvalue()) % tarfile.RECORDSIZE == 0
    return buf.getvalue()


def test_a_task_reserves_its_shards_blocks_and_the_shard_ends_where_its_tar_ends(image_tree, tmp_path, monkeypatch):
    """Each shard's blocks are reserved before its samples are written (a full disk fails there, and
    the writes cost the kernel less), from the plan's upper bound; the file is then cut to the tar."""
    reserved, real = {}, os.posix_fallocate

    def spy(fd, offset, length):
        reserved[os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))] = (offset, length, os.fstat(fd).st_size)
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", spy)
    m = pack(image_tree, tmp_path / "d", "wds", workers=1, shard_size=2)  # whole shards: no pieces
    assert len(m["shards"]) > 1 and sorted(reserved) == sorted(s["name"] for s in m["shards"])
    for s in m["shards"]:
        shard = tmp_path / "d" / s["name"]
        offset, length, before = reserved[s["name"]]
        assert offset == 0 and before == 0 and length >= shard.stat().st_size == s["bytes"]
        assert shard.read_bytes() == as_one_tarfile(shard)


def test_tar_headers_equal_tarfiles_for_every_name_and_size():
    """The patched ustar template (short ASCII names, sizes under 8 GiB) and the tobuf fallback
    (long, non-ASCII names; 8 GiB and more) give TarFile's bytes."""
    from pixfeed.packers import _tar

    rng = np.random.default_rng(3)
    names = ["".join(rng.choice(list("abcXYZ019._-/ "), int(n))) for n in rng.integers(1, 101, 300)]
    names += ["x" * 100, "y" * 101, "z" * 300, "caf\u00e9.jpg", "\u732b/0001.json", "a.cls"]
    for name in names:
        for size in (0, 1, 511, 512, int(rng.integers(0, 8 ** 11)), 8 ** 11 - 1, 8 ** 11, 10 ** 12):
            want = _tar.member_info(name, size).tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            assert _tar.header(name, size) == want, (name, size)


def test_default_shards_keep_a_small_dataset_in_many_whole_shards(tmp_path, monkeypatch):
    """Without --shard-size/--shard-bytes the bound is 256 MiB, down to 16 MiB so that a dataset
    makes 64 shards; each is one pack task (no pieces), and every sample is read back once."""
    from pixfeed.packers import wds as writer

    assert writer.default_shard_bytes(100 << 30) == 256 << 20
    assert writer.default_shard_bytes(2 << 30) == 32 << 20
    assert writer.default_shard_bytes(10 << 20) == 16 << 20
    image_tree = make_tree(tmp_path / "src", per_class=8)
    monkeypatch.setattr(writer, "SMALLEST_DEFAULT_SHARD", tarfile.RECORDSIZE)
    monkeypatch.setattr(writer, "MIN_SHARDS", 8)  # 4 tasks for each of 2 workers
    joined = []
    monkeypatch.setattr(writer._tar, "join", lambda *a: joined.append(a))
    m = pack(image_tree, tmp_path / "d", "wds", workers=2, store="encoded")
    assert len(m["shards"]) >= 8
    assert joined == []
    assert sorted(i for i, _ in Indexed(tmp_path / "d", shuffle=False)) == list(range(m["count"]))
    assert all(s["xxh3_64"] == file_hash(tmp_path / "d" / s["name"]) for s in m["shards"])


@pytest.mark.parametrize("most", [1, 7, 512, 100_000])
def test_writev_all_finishes_what_a_short_writev_left(tmp_path, monkeypatch, most):
    """A shard's sample goes out in one writev; where the kernel takes less, the rest follows, in order."""
    import os

    from pixfeed.packers._files import writev_all

    real, write = os.writev, os.write
    monkeypatch.setattr(os, "writev", lambda fd, views: real(fd, [bytes(b"".join(views)[:most])]))
    monkeypatch.setattr(os, "write", lambda fd, data: write(fd, bytes(data)[:most]))  # short again
    rng = np.random.default_rng(0)
    buffers = [rng.bytes(int(n)) for n in (0, 3, 512, 0, 1000, 70_000, 5)]
    buffers[2] = memoryview(np.frombuffer(buffers[2], np.uint8))  # a record's view of its source file
    fd = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        assert writev_all(fd, buffers) == sum(len(bytes(b)) for b in buffers)
    finally:
        os.close(fd)
    assert (tmp_path / "out").read_bytes() == b"".join(bytes(b) for b in buffers)


def test_local_shards_group_as_webdataset_groups_them(tmp_path):
    """The header walk that reads local shards gives webdataset's samples: keys up to the first dot of
    the base name (folders kept), extensions lower-cased, meta members and dotless names skipped; members
    of unwanted samples are not read, and a local shard's image members can come back as (offset, size)."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    from pixfeed.datasets.wds import _walk

    names = ["a/000.jpg", "a/000.JSON", "a/000.seg.png", "README", "__meta__", "__x__/y.txt",
             "b.c.d.txt", "b.jpg", "000.jpg", "000.cls"]
    path = tmp_path / "s.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for k, name in enumerate(names):
            add_member(tar, name, f"{k}-{name}".encode() * (k + 1))
    with open(path, "rb") as f:
        want = [{k: v for k, v in s.items() if k != "__url__" and k != "__local_path__"}
                for s in group_by_keys(tar_file_expander([{"url": str(path), "stream": f}]))]
    with open(path, "rb") as f:
        got = list(_walk(f, lambda j: True))
    assert got == want and [s["__key__"] for s in got] == ["a/000", "b", "000"]
    with open(path, "rb") as f:
        lazy = list(_walk(f, lambda j: j == 1, sized=("jpg",)))
    assert lazy[0] == {"__key__": "a/000"} and lazy[2] == {"__key__": "000"}
    offset, size = lazy[1]["jpg"]
    assert path.read_bytes()[offset:offset + size] == want[1]["jpg"] and lazy[1]["c.d.txt"] == want[1]["c.d.txt"]


def test_indexing_a_stream_says_how_to_get_random_access(image_tree, tmp_path):
    pack(image_tree, tmp_path / "w", "wds", store="encoded")
    ds = open_dataset(tmp_path / "w")
    with pytest.raises(TypeError, match=r"read as a stream .* pixfeed pack .* NEW --format mmap"):
        ds[0]
