"""WebDataset tar shards as a pack's source: shards written by ``webdataset.ShardWriter`` and, with plain
``tarfile``, in img2dataset's layout, packed into every format and store with every field equal; the same
shards from the bucket of the object-storage tests; and the bad inputs, each named, nothing left at DST."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from conftest import make_tree, sized
from pixfeed import registry
from pixfeed.cli import main
from pixfeed.datasets import open_dataset
from pixfeed.errors import OptionError, SourceError
from pixfeed.storage.store import Store
from pixfeed.packers import pack

CASES = [(f, s) for f in sorted(registry.FORMATS) for s in ("pixels", "encoded")]


def jpeg(i: int, size=(40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(i).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def writer_shards(root: Path, count: int = 12) -> dict:
    """Shards by webdataset.ShardWriter (5 samples each); returns {key: the sample as written}."""
    root.mkdir(parents=True)
    written = {}
    with wds.ShardWriter(str(root / "sw-%06d.tar"), maxcount=5, verbose=0) as w:
        for i in range(count):
            sample = {"__key__": f"s{i:04d}", "jpg": jpeg(i), "txt": f"caption {i}",
                      "json": {"i": i, "tags": [i, i + 1]}, "cls": i % 3,
                      "npy": np.arange(i % 4 + 1, dtype=np.float32)}
            w.write(sample)
            written[sample["__key__"]] = sample
    return written


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def img2dataset_shard(path: Path, count: int = 6, start: int = 0) -> dict:
    """One shard in img2dataset's layout (00000/000000012.jpg, .txt, .json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = {}
    with tarfile.open(path, "w") as tar:
        for i in range(start, start + count):
            key = f"00000/{i:09d}"
            meta = {"url": f"http://example.com/{i}.jpg", "width": 40, "height": 30}
            add(tar, f"{key}.jpg", jpeg(100 + i))
            add(tar, f"{key}.txt", f"a photo {i}".encode())
            add(tar, f"{key}.json", json.dumps(meta).encode())
            written[key] = {"jpg": jpeg(100 + i), "txt": f"a photo {i}", "json": meta}
    return written


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    return {"writer": (str(root / "sw" / "sw-{000000..000002}.tar"), writer_shards(root / "sw")),
            "img2dataset": (str(root / "img2"), img2dataset_shard(root / "img2" / "00000.tar"))}


def records(path: Path) -> dict:
    ds = open_dataset(path, fields=None)
    items = list(ds) if ds.format == "wds" else [ds[i] for i in range(len(ds))]
    keys = [ds.key(i) for i in range(len(ds))] if ds.format != "wds" else None
    return {(keys[n] if keys else None): r for n, r in enumerate(items)} if keys else items


@pytest.mark.parametrize("fmt, store", CASES)
@pytest.mark.parametrize("kind", ["writer", "img2dataset"])
def test_shards_pack_into_every_format_and_store_with_every_field(shards, tmp_path, fmt, store, kind):
    src, written = shards[kind]
    m = pack(src, tmp_path / "ds", fmt, store=store, workers=2, **sized(store, 16))
    assert m["count"] == len(written) and m["source"]["kind"] == "shards"
    ds = open_dataset(tmp_path / "ds", fields=None)
    keys = json.loads((tmp_path / "ds" / "keys.json").read_text())
    assert sorted(keys) == sorted(written)
    items = list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))]
    if fmt == "wds":  # a stream, shuffled: match samples by their caption
        by_text = {w["txt"]: k for k, w in written.items()}
        pairs = [(by_text[r["txt"]], r) for r in items]
    else:
        pairs = list(zip(keys, items))
    assert len(pairs) == len(written)
    for key, r in pairs:
        w = written[key]
        assert r["txt"] == w["txt"] and r["json"] == w["json"]
        if kind == "writer":
            assert r["label"] == w["cls"] and r["npy"].tolist() == w["npy"].tolist()
        else:
            assert r["label"] == -1
        if store == "encoded" and fmt != "wds":
            idx, stored, _ = ds.read_checked([keys.index(key)])
            assert bytes(stored[0]) == w["jpg"]  # the image bytes, as they were in the shard
        assert tuple(r["image"].shape) == ((3, 16, 16) if store == "pixels" else (3, 30, 40))


def test_shards_from_a_bucket_pack_as_the_local_ones(shards, s3_server, tmp_path, monkeypatch):
    import fsspec

    src, written = shards["img2dataset"]
    fs = fsspec.filesystem("s3", **s3_server.options)
    fs.put(str(Path(src) / "00000.tar"), "pixfeed/shard-src/00000.tar")
    url = "s3://pixfeed/shard-src"
    gets = []
    read_range = Store.read_range
    monkeypatch.setattr(Store, "read_range", lambda self, *a: gets.append(a) or read_range(self, *a))
    m = pack(url, tmp_path / "remote", "mmap", store="encoded", storage_options=s3_server.options, workers=1)
    assert 0 < len(gets) < len(written)  # a task's images come from one ranged GET, not one each
    local = pack(src, tmp_path / "local", "mmap", store="encoded", workers=2)
    assert m["count"] == local["count"] == len(written) and m["source"]["kind"] == "shards"
    assert (tmp_path / "remote" / "data.bin").read_bytes() == (tmp_path / "local" / "data.bin").read_bytes()
    assert records(tmp_path / "remote").keys() == records(tmp_path / "local").keys()


def test_bad_shards_are_named_and_nothing_is_left(tmp_path):
    with pytest.raises(SourceError, match=r"no shard .*none-000000.tar \(and 2 more of the pattern's 3\)"):
        pack(str(tmp_path / "none-{000000..000002}.tar"), tmp_path / "out", "mmap")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.tar").write_bytes(b"this is not a tar file at all" * 40)
    with pytest.raises(SourceError, match=r"x.tar: not a readable tar shard"):
        pack(tmp_path / "bad", tmp_path / "out", "mmap")
    two = tmp_path / "two" / "0.tar"
    two.parent.mkdir()
    with tarfile.open(two, "w") as tar:
        add(tar, "a.jpg", jpeg(1))
        add(tar, "a.png", jpeg(2))
    with pytest.raises(SourceError, match=r"sample 'a' has two image members, a.jpg and a.png; choose one with "
                                          r"--image-ext"):
        pack(two.parent, tmp_path / "out", "mmap")
    m = pack(two.parent, tmp_path / "chosen", "mmap", store="encoded", image_ext="jpg")
    assert m["count"] == 1 and m["options"]["image_ext"] == "jpg"
    mixed = tmp_path / "mixed" / "0.tar"
    mixed.parent.mkdir()
    with tarfile.open(mixed, "w") as tar:
        add(tar, "a.jpg", jpeg(1))
        add(tar, "a.npy", _npy(np.zeros(3, np.float32)))
        add(tar, "b.jpg", jpeg(2))
        add(tar, "b.npy", _npy(np.zeros((2, 2), np.int64)))
        add(tar, "c.txt", b"no image here")
    with pytest.raises(SourceError, match=r"sample 'c' has no image member \(members: c.txt\)"):
        pack(mixed.parent, tmp_path / "out", "mmap")
    with pytest.raises(SourceError, match=r"field 'npy' \(.npy\) is float32\[3\] in one sample and int64\[2, 2\]"):
        pack(mixed.parent, tmp_path / "out", "mmap", on_error="skip")
    assert not (tmp_path / "out").exists()
    with pytest.raises(OptionError, match="--image-ext applies to an index file or WebDataset shards"):
        pack(_folder(tmp_path), tmp_path / "out", "mmap", image_ext="jpg")


def test_a_truncated_shard_follows_on_error(tmp_path, capsys):
    whole = img2dataset_shard(tmp_path / "t" / "0.tar", count=4)
    img2dataset_shard(tmp_path / "t" / "1.tar", count=4, start=4)
    data = (tmp_path / "t" / "1.tar").read_bytes()
    (tmp_path / "t" / "1.tar").write_bytes(data[:len(data) // 2])  # ends inside a member
    with pytest.raises(SourceError, match=r"1.tar: not a readable tar shard, or it ends early"):
        pack(tmp_path / "t", tmp_path / "out", "mmap", store="encoded")
    assert not (tmp_path / "out").exists()
    assert main(["pack", str(tmp_path / "t"), str(tmp_path / "out"), "--store", "encoded", "--on-error", "skip",
                 "-q"]) == 0
    m = json.loads((tmp_path / "out" / "pixfeed.json").read_text())
    assert m["count"] >= len(whole) and any("1.tar: not a readable tar shard" in s["reason"] for s in m["skipped"])
    assert main(["info", str(tmp_path / "out")]) == 0
    assert "WebDataset shards" in capsys.readouterr().out


def test_a_shard_that_shrinks_after_its_scan_is_named_per_sample(tmp_path):
    """The pack's tasks read each image at the place the scan found it: a shard cut short in between
    gives its lost samples a named error (skipped with on_error="skip"), never short bytes."""
    from pixfeed.sources.shards import scan_shards

    img2dataset_shard(tmp_path / "t" / "0.tar", count=4)
    source = scan_shards(tmp_path / "t")
    path = tmp_path / "t" / "0.tar"
    path.write_bytes(path.read_bytes()[:int(source.extents[2][1]) + 10])  # inside the third image
    with pytest.raises(SourceError, match=r"0.tar: 10 bytes at \d+, \d+ expected; the shard changed or shrank"):
        pack(source, tmp_path / "out", "mmap", store="encoded", workers=1)
    m = pack(source, tmp_path / "out", "mmap", store="encoded", workers=1, on_error="skip")
    assert m["count"] == 2 and len(m["skipped"]) == 2
    assert all("changed or shrank since it was scanned" in s["reason"] for s in m["skipped"])


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "folder" / "cat"
    root.mkdir(parents=True)
    (root / "a.jpg").write_bytes(jpeg(3))
    return root.parent


def test_shards_walked_on_workers_give_the_pack_of_one_walk(tmp_path):
    """Each shard's headers are walked as a job of the pack's local workers: the samples, their order
    and the skipped samples are those of one walk in the driver."""
    for s in range(4):
        img2dataset_shard(tmp_path / "src" / f"{s}.tar", count=3, start=3 * s)
    with tarfile.open(tmp_path / "src" / "2.tar", "a") as tar:
        add(tar, "00000/lonely.txt", b"a sample without an image")
    one = pack(tmp_path / "src", tmp_path / "one", "mmap", store="encoded", on_error="skip", workers=1)
    two = pack(tmp_path / "src", tmp_path / "two", "mmap", store="encoded", on_error="skip", workers=2)
    assert one["files"] == two["files"] and one["count"] == two["count"] == 12
    assert [s for s in two["skipped"] if "lonely" in s["reason"]] == \
        [s for s in one["skipped"] if "lonely" in s["reason"]] != []
    a, b = open_dataset(tmp_path / "one"), open_dataset(tmp_path / "two")
    assert [a.key(i) for i in range(len(a))] == [b.key(i) for i in range(len(b))]


def test_shards_pixfeed_wrote_keep_their_class_names(tmp_path):
    """Their .json members name each .cls label's class: the classes stay named, and the .json (the old
    pack's bookkeeping) is no field of the new pack."""
    src = make_tree(tmp_path / "src")
    pack(src, tmp_path / "wds", "wds", workers=1, shard_size=5)
    shards = tmp_path / "shards"
    shards.mkdir()
    for shard in (tmp_path / "wds").glob("*.tar"):
        (shards / shard.name).write_bytes(shard.read_bytes())  # the shards alone, no pixfeed.json
    m = pack(shards, tmp_path / "again", "mmap", store="encoded", workers=1)
    assert m["classes"] == ["cat", "dog", "eel"] and m["schema"] == []
    ds = open_dataset(tmp_path / "again")
    assert sorted(ds.classes[int(ds[i][1])] + "/" for i in range(len(ds))) == sorted(
        p.parent.name + "/" for p in src.rglob("img*"))
