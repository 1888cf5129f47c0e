"""A pixfeed dataset as a pack's source: every map-style format to every format, both stores."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import pixfeed
from conftest import make_tree
from fieldtree import FIELDS, make_field_tree
from pixfeed.errors import CorruptDataError, OptionError
from pixfeed.verify.check import verify

FIELD_OPTS = dict(field=[f for f in FIELDS[1::2] if ":" in f], per_box="box_cls")


def everything(path):
    ds = pixfeed.open_dataset(path, fields=None, **({"shuffle": False} if
                                                    pixfeed.read_manifest(path)["format"] == "wds" else {}))
    items = list(ds) if isinstance(ds, torch.utils.data.IterableDataset) else [ds[i] for i in range(len(ds))]
    return {item["caption"]: item for item in items}


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_field_tree(tmp_path_factory.mktemp("repack"), 5)


@pytest.mark.parametrize("store", ["encoded", "pixels"])
@pytest.mark.parametrize("old", ["mmap", "lmdb", "hdf5", "wds"])
def test_repack_to_every_format_keeps_every_field(tree, tmp_path, old, store):
    size = {"size": 24} if store == "pixels" else {}
    pixfeed.pack(tree, tmp_path / "old", old, store=store, index=str(tree / "index.csv"), workers=1, **size,
                 **FIELD_OPTS)
    want = everything(tmp_path / "old")
    for new in ("mmap", "lmdb", "hdf5", "wds"):
        m = pixfeed.pack(tmp_path / "old", tmp_path / new, new, store=store, workers=1, **size)
        assert m["source"] == {"kind": "pixfeed", "path": str(tmp_path / "old"), "format": old, "store": store}
        assert m["classes"] == ["cat", "dog"] and m["schema"] == pixfeed.read_manifest(tmp_path / "old")["schema"]
        got = everything(tmp_path / new)
        assert got.keys() == want.keys() and all(same(got[k], want[k]) for k in want), (old, new)
        ds = pixfeed.open_dataset(tmp_path / new)
        if new != "wds":
            assert [ds.key(i) for i in range(len(ds))] == [pixfeed.open_dataset(tmp_path / "old").key(i)
                                                           for i in range(len(ds))]


def test_repack_to_pixels_equals_packing_the_folder(tmp_path):
    src = make_tree(tmp_path / "src")
    pixfeed.pack(src, tmp_path / "enc", "lmdb", workers=1)
    a = pixfeed.pack(tmp_path / "enc", tmp_path / "a", "mmap", store="pixels", size=16, workers=1)
    b = pixfeed.pack(src, tmp_path / "b", "mmap", store="pixels", size=16, workers=1)
    assert a["files"] == b["files"] and a["classes"] == b["classes"]


def test_repack_refusals_and_damage(tmp_path):
    src = make_tree(tmp_path / "src")
    pixfeed.pack(src, tmp_path / "old", "mmap", store="encoded", workers=1)
    with pytest.raises(OptionError, match="is the source dataset itself"):
        pixfeed.pack(tmp_path / "old", tmp_path / "old", "lmdb", overwrite=True)
    pixfeed.pack(src, tmp_path / "shards", "wds", shard_size=5, workers=1)
    shard = sorted((tmp_path / "shards").glob("*.tar"))[1]
    tar = bytearray(shard.read_bytes())
    jpeg = tar.index(b"\xff\xd8\xff")  # inside the shard's first image member
    tar[jpeg + 200] ^= 0xFF
    shard.write_bytes(bytes(tar))
    with pytest.raises(CorruptDataError, match=f"{shard.name}.*checksum"):
        pixfeed.pack(tmp_path / "shards", tmp_path / "x", "mmap", workers=1)
    assert not (tmp_path / "x").exists()
    data = bytearray((tmp_path / "old/data.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "old/data.bin").write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="checksum"):
        pixfeed.pack(tmp_path / "old", tmp_path / "new", "lmdb", workers=1)
    assert not (tmp_path / "new").exists()
    assert np.all([not p.name.startswith(".new") for p in tmp_path.iterdir()])


def test_a_repack_reads_jpeg_headers_only_and_keeps_every_shape(tmp_path, monkeypatch):
    """Records checked when first packed are not parsed whole again; their shapes (EXIF orientation
    applied) are what a full check gives."""
    from conftest import write_image
    from pixfeed.packers import records

    src = make_tree(tmp_path / "src", per_class=4)
    for orientation in (6, 8):  # rotated: the stored shape is the oriented one
        exif = __import__("PIL.Image", fromlist=["Image"]).Exif()
        exif[0x0112] = orientation
        write_image(src / "cat" / f"rot{orientation}.jpg", size=(40, 24), exif=exif.tobytes())
    pixfeed.pack(src, tmp_path / "old", "mmap", store="encoded", workers=1)
    full, hashed = [], []
    check, rehash = records.check_encoded, records.record_hash
    monkeypatch.setattr(records, "check_encoded", lambda data, *a, **k: full.append(data[:4]) or check(data, *a, **k))
    monkeypatch.setattr(records, "record_hash", lambda data: hashed.append(len(data)) or rehash(data))
    pixfeed.pack(tmp_path / "old", tmp_path / "new", "lmdb", store="encoded", workers=1)
    assert full and all(head.startswith(b"\x89PNG") for head in full)  # only the PNGs were parsed whole
    assert not hashed  # each record keeps the checksum it was checked against on the way in
    pixfeed.pack(tmp_path / "old", tmp_path / "small", "lmdb", store="encoded", max_side=16, workers=1)
    small = pixfeed.open_dataset(tmp_path / "small")
    assert len(hashed) == len(small)  # re-encoded: new bytes, hashed
    small.read_checked(range(len(small)))  # and their checksums hold
    monkeypatch.undo()
    pixfeed.pack(src, tmp_path / "direct", "lmdb", store="encoded", workers=1)
    assert headers(tmp_path / "new") == headers(tmp_path / "direct")  # the same (H, W) as a full check's
    old, new = pixfeed.open_dataset(tmp_path / "old"), pixfeed.open_dataset(tmp_path / "new")
    for i in range(len(old)):
        assert torch.equal(old[i][0], new[i][0])


@pytest.mark.parametrize("new", ["mmap", "hdf5"])
def test_a_repack_into_a_format_without_shapes_parses_nothing_it_checked_under_a_limit_as_strict(
        tmp_path, monkeypatch, new):
    """mmap and HDF5 store no image shape: records a pixfeed source checked under a pixel limit no
    looser than the repack's, their checksums verified on the way in, are taken as they are.  A
    stricter --max-pixels, a fuller check, or a source that records no limit parses them again."""
    import json
    from conftest import write_image
    from pixfeed.image import decode as decode_module  # probed's header parse: decode.probe
    from pixfeed.packers import records

    src = make_tree(tmp_path / "src", per_class=3)
    write_image(src / "cat" / "big.jpg", size=(60, 50))  # 3000 pixels, the rest 16 x 16 or so
    pixfeed.pack(src, tmp_path / "old", "mmap", store="encoded", max_pixels=5000, workers=1)
    parsed = []
    probe, check = decode_module.probe, records.check_encoded
    monkeypatch.setattr(decode_module, "probe", lambda data: parsed.append(1) or probe(data))
    monkeypatch.setattr(records, "check_encoded", lambda data, *a, **k: parsed.append(1) or check(data, *a, **k))

    pixfeed.pack(tmp_path / "old", tmp_path / "same", new, store="encoded", max_pixels=5000, workers=1)
    pixfeed.pack(tmp_path / "old", tmp_path / "looser", new, store="encoded", workers=1)  # Pillow's: 89M
    assert parsed == []
    old = pixfeed.open_dataset(tmp_path / "old")
    for path in (tmp_path / "same", tmp_path / "looser"):
        ds = pixfeed.open_dataset(path)
        assert len(ds) == len(old) and all(torch.equal(old[i][0], ds[i][0]) for i in range(len(old)))
        assert verify(path).ok, verify(path).problems

    with pytest.raises(Exception, match=r"big.* 3000 pixels exceeds the decompression-bomb limit of 2000"):
        pixfeed.pack(tmp_path / "old", tmp_path / "stricter", new, store="encoded", max_pixels=2000, workers=1)
    assert parsed
    parsed.clear()
    pixfeed.pack(tmp_path / "old", tmp_path / "full", new, store="encoded", full_check=True, workers=1)
    assert len(parsed) == len(old)
    manifest = json.loads((tmp_path / "old" / "pixfeed.json").read_text())
    del manifest["options"]["max_pixels"]  # a dataset that does not say which limit it was checked under
    (tmp_path / "old" / "pixfeed.json").write_text(json.dumps(manifest))
    parsed.clear()
    pixfeed.pack(tmp_path / "old", tmp_path / "unknown", new, store="encoded", max_pixels=5000, workers=1)
    assert len(parsed) == len(old)


def headers(path):
    """Every LMDB record's header (kind, label, checksum, H, W, length), read with plain lmdb."""
    import lmdb
    from pixfeed.record import parse

    env = lmdb.open(str(path / "data.mdb"), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        out = sorted(tuple(parse(value, "test")[0])[2:] for key, value in txn.cursor() if key.isdigit())
    env.close()
    return out


def test_a_repack_keeps_the_source_store_and_size_unless_told(tmp_path):
    """Without --store, a repack stores what OLD stored (mmap's own default is pixels at 256): encoded
    bytes stay the same bytes, stored pixels keep their size; --size (or --store) still decides."""
    src = make_tree(tmp_path / "src")
    pixfeed.pack(src, tmp_path / "enc", "lmdb", workers=1)
    m = pixfeed.pack(tmp_path / "enc", tmp_path / "mmap", "mmap", workers=1)
    assert m["store"] == "encoded" and m["shape"] is None
    old, new = pixfeed.open_dataset(tmp_path / "enc"), pixfeed.open_dataset(tmp_path / "mmap")
    assert all(bytes(old.read_checked([i])[1][0]) == bytes(new.read_checked([i])[1][0]) for i in range(len(old)))
    pixfeed.pack(src, tmp_path / "pix", "hdf5", store="pixels", size="20x24", workers=1)
    assert pixfeed.pack(tmp_path / "pix", tmp_path / "pix2", "mmap", workers=1)["shape"] == [20, 24, 3]
    assert pixfeed.pack(tmp_path / "pix", tmp_path / "pix3", "wds", workers=1)["store"] == "pixels"
    assert pixfeed.pack(tmp_path / "enc", tmp_path / "small", "mmap", size=16, workers=1)["shape"] == [16, 16, 3]
    assert pixfeed.pack(tmp_path / "pix", tmp_path / "enc2", "mmap", store="encoded", workers=1)["store"] == "encoded"


@pytest.mark.parametrize("old", ["mmap", "wds"])
def test_a_repack_looks_no_key_up_unless_it_reports_an_error(tree, tmp_path, monkeypatch, old):
    """Where a record is (its key, for messages) is formatted only into an error: a repack of a dataset
    with fields (a mask among them) never looks a key up (before the key index was kept open, each
    lookup opened it: it cost a wds -> mmap repack more than its reading and writing)."""
    from pixfeed import keyindex

    pixfeed.pack(tree, tmp_path / "old", old, store="encoded", index=str(tree / "index.csv"), workers=1,
                 **FIELD_OPTS)
    want = everything(tmp_path / "old")

    def lookup(*args):
        raise AssertionError("a key looked up")

    monkeypatch.setattr(keyindex.KeyIndex, "__getitem__", lookup)
    pixfeed.pack(tmp_path / "old", tmp_path / "new", "mmap", workers=2)
    monkeypatch.undo()
    got = everything(tmp_path / "new")
    assert got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)


def test_a_wds_source_walked_on_workers_keeps_record_order(tree, tmp_path):
    """The shards' headers are walked a shard per job on the local workers; the repack is the same
    as one walked in a single process, record for record, and damage found there is named."""
    pixfeed.pack(tree, tmp_path / "old", "wds", store="encoded", index=str(tree / "index.csv"), shard_size=1,
                 workers=1, **FIELD_OPTS)
    assert len(pixfeed.read_manifest(tmp_path / "old")["shards"]) >= 4
    one = pixfeed.pack(tmp_path / "old", tmp_path / "one", "mmap", workers=1)
    two = pixfeed.pack(tmp_path / "old", tmp_path / "two", "mmap", workers=2)
    assert one["files"] == two["files"]
    a, b = (pixfeed.open_dataset(tmp_path / name, fields=None) for name in ("one", "two"))
    assert [a.key(i) for i in range(len(a))] == [b.key(i) for i in range(len(b))]
    shard = sorted((tmp_path / "old").glob("*.tar"))[2]
    tar = bytearray(shard.read_bytes())
    meta = tar.index(b'"xxh3_64"')  # inside the shard's first .json member
    tar[meta + 12] ^= 0x01
    shard.write_bytes(bytes(tar))
    with pytest.raises(pixfeed.errors.PixfeedError, match=shard.name):
        pixfeed.pack(tmp_path / "old", tmp_path / "bad", "mmap", workers=2)
    assert not (tmp_path / "bad").exists()
