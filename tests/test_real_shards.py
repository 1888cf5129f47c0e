"""Data as other tools write it (issue 38): WebP images (img2dataset's --encode_format webp), tar shards whose
members are not next to each other (a plain ``tar -cf``), gzip-compressed shards, COCO crowd annotations (RLE),
and the loader's plan and ``pixfeed verify`` saying what is true."""
from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pixfeed import registry
from pixfeed.cli import main
from pixfeed.datasets import open_dataset
from pixfeed.errors import ImageDecodeError, SourceError
from pixfeed.image.decode import check_encoded, decode, decode_for_pack
from pixfeed.packers import pack
from pixfeed.verify.check import verify

CASES = [(f, s) for f in sorted(registry.FORMATS) for s in ("pixels", "encoded")]


def pixels(i: int, size=(40, 30)) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)


def webp(i: int, size=(40, 30), **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels(i, size)).save(buf, "WEBP", **(save or {"lossless": True}))
    return buf.getvalue()


def jpeg(i: int, size=(40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels(i, size)).save(buf, "JPEG")
    return buf.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def read_all(path, **kw) -> list:
    """Every record as a dict (a wds dataset read as the stream it is)."""
    ds = open_dataset(path, fields=None, **kw)
    try:
        return [ds[i] for i in range(len(ds))]
    except TypeError:
        return list(ds)


# --- 6: WebP ---------------------------------------------------------------------------------------------------

def img2dataset_webp_shard(path: Path, count: int = 6) -> dict:
    """img2dataset's layout with --encode_format webp: 00000/000000012.webp, .txt, .json."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = {}
    with tarfile.open(path, "w") as tar:
        for i in range(count):
            key = f"00000/{i:09d}"
            add(tar, f"{key}.webp", webp(i, (40 + i, 30)))
            add(tar, f"{key}.txt", f"caption {i}".encode())
            add(tar, f"{key}.json", json.dumps({"key": f"{i:09d}", "width": 40 + i}).encode())
            written[key] = i
    return written


def test_webp_is_sniffed_decoded_exactly_and_checked():
    data = webp(3)
    want = pixels(3)
    assert np.array_equal(decode(data, exact=True), want)
    assert np.array_equal(decode(data), want)  # the fast path (Pillow for WebP)
    assert decode(data, size=(16, 16)).shape == (16, 16, 3)
    assert check_encoded(data, "x.webp") == ("WEBP", (30, 40))
    with pytest.raises(ImageDecodeError, match="decompression-bomb"):
        decode(data, max_pixels=40 * 30 - 1)
    with pytest.raises(ImageDecodeError, match="truncated WebP"):
        check_encoded(data[:-10], "x.webp")
    wave = b"RIFF" + (36).to_bytes(4, "little") + b"WAVEfmt " + bytes(28)  # RIFF, but not WebP
    with pytest.raises(ImageDecodeError, match="not a JPEG, PNG or WebP file"):
        decode(wave, exact=True)


@pytest.mark.parametrize("fmt, store", CASES)
def test_img2dataset_webp_shards_pack_read_and_verify(tmp_path, fmt, store):
    img2dataset_webp_shard(tmp_path / "shards" / "00000.tar")
    size = {"size": 24} if store == "pixels" else {}
    m = pack(tmp_path / "shards", tmp_path / "ds", fmt, store=store, workers=1, **size)
    assert m["count"] == 6 and not m["skipped"]
    assert verify(tmp_path / "ds", deep=True).ok
    records = read_all(tmp_path / "ds")
    by_caption = {r["txt"]: r for r in records}
    for i in range(6):
        image = by_caption[f"caption {i}"]["image"].permute(1, 2, 0).numpy()
        want = pixels(i, (40 + i, 30))
        if store == "pixels":
            want = decode_for_pack(webp(i, (40 + i, 30)), (24, 24), "crop", "x")[0]
        assert np.array_equal(image, want)
    if fmt == "wds" and store == "encoded":
        names = tarfile.open(tmp_path / "ds" / "shard-000000.tar").getnames()
        assert sum(n.endswith(".webp") for n in names) == 6


def test_a_folder_of_webp_packs_with_ext_and_lossy_webp_reads_as_pillow_decodes(tmp_path):
    for i in range(3):
        path = tmp_path / "src" / "cls" / f"{i}.webp"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(webp(i, quality=80))
    pack(tmp_path / "src", tmp_path / "ds", "lmdb", store="encoded", ext="webp", workers=1)
    ds = open_dataset(tmp_path / "ds")
    for i in range(3):
        want = np.asarray(Image.open(tmp_path / "src" / "cls" / f"{ds.key(i).split('/')[-1]}.webp").convert("RGB"))
        assert np.array_equal(ds[i][0].permute(1, 2, 0).numpy(), want)


# --- 2: members of one sample apart in the tar -------------------------------------------------------------------

def readdir_order_shard(path: Path, count: int = 10, lonely: int = 0) -> dict:
    """A shard as a plain ``tar -cf`` of a folder may list it: every caption first, then every image (and
    ``lonely`` captions without an image)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = {}
    with tarfile.open(path, "w") as tar:
        for i in range(count + lonely):
            add(tar, f"./{i:04d}.txt", f"caption {i}".encode())
        for i in range(count):
            add(tar, f"./{i:04d}.jpg", jpeg(i))
            written[f"./{i:04d}"] = f"caption {i}"
    return written


def test_members_apart_are_grouped_by_key_with_a_note_naming_tar_sort(tmp_path):
    written = readdir_order_shard(tmp_path / "src" / "x.tar")
    m = pack(tmp_path / "src", tmp_path / "ds", "mmap", store="encoded", workers=1)
    assert m["count"] == 10 and not m["skipped"]
    note = next(n for n in m["notes"] if "not next to each other" in n)
    assert "10 sample(s)" in note and "tar --sort=name" in note
    ds = open_dataset(tmp_path / "ds", fields=None)
    got = {ds.key(i): ds[i] for i in range(len(ds))}
    assert {k: r["txt"] for k, r in got.items()} == written  # every caption with its own image
    for k, r in got.items():
        assert np.array_equal(r["image"].permute(1, 2, 0).numpy(), decode(jpeg(int(k[2:])), exact=True))


def test_samples_left_out_are_counted_as_skipped_in_the_report_and_info(tmp_path, capsys):
    readdir_order_shard(tmp_path / "src" / "x.tar", count=4, lonely=3)
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--store", "encoded", "--workers", "1",
                 "--on-error", "skip"]) == 0
    out, err = capsys.readouterr()
    assert "packed 4 images" in out and "3 skipped" in out and err.count("has no image member") == 3
    m = json.loads((tmp_path / "ds" / "pixfeed.json").read_text())
    assert m["count"] == 4 and len(m["skipped"]) == 3
    assert all("has no image member" in s["reason"] for s in m["skipped"])
    assert main(["info", str(tmp_path / "ds")]) == 0
    assert "skipped   3:" in capsys.readouterr().out


def test_a_member_named_twice_in_a_shard_is_an_error_of_its_sample(tmp_path):
    path = tmp_path / "src" / "x.tar"
    path.parent.mkdir(parents=True)
    with tarfile.open(path, "w") as tar:
        add(tar, "a.jpg", jpeg(0))
        add(tar, "b.jpg", jpeg(1))
        add(tar, "a.jpg", jpeg(2))
    with pytest.raises(SourceError, match=r"sample 'a' has member a.jpg twice"):
        pack(tmp_path / "src", tmp_path / "ds", "mmap", store="encoded", workers=1)
    m = pack(tmp_path / "src", tmp_path / "ds", "mmap", store="encoded", workers=1, on_error="skip")
    assert m["count"] == 1 and len(m["skipped"]) == 1


# --- 7: gzip-compressed shards ---------------------------------------------------------------------------------

def gz_shards(root: Path, count: int = 12) -> dict:
    """``.tar.gz`` shards by webdataset.ShardWriter (it compresses a name ending in .gz)."""
    import webdataset as wds

    root.mkdir(parents=True)
    written = {}
    with wds.ShardWriter(str(root / "sw-%06d.tar.gz"), maxcount=5, verbose=0) as w:
        for i in range(count):
            sample = {"__key__": f"s{i:04d}", "jpg": jpeg(i), "txt": f"caption {i}", "cls": i % 3,
                      "json": {"i": i}}
            w.write(sample)
            written[sample["__key__"]] = sample
    return written


@pytest.mark.parametrize("fmt, store", [("mmap", "encoded"), ("lmdb", "pixels"), ("wds", "encoded")])
def test_tar_gz_shards_pack_as_webdataset_reads_them(tmp_path, fmt, store):
    import webdataset as wds

    written = gz_shards(tmp_path / "gz")
    assert sorted(p.name for p in (tmp_path / "gz").iterdir()) == [f"sw-{i:06d}.tar.gz" for i in range(3)]
    theirs = {s["__key__"]: s for s in wds.WebDataset(str(tmp_path / "gz" / "sw-{000000..000002}.tar.gz"),
                                                       shardshuffle=False)}
    assert sorted(theirs) == sorted(written)
    size = {"size": 24} if store == "pixels" else {}
    for src in (tmp_path / "gz", tmp_path / "gz" / "sw-{000000..000002}.tar.gz"):
        dst = tmp_path / f"ds-{fmt}-{len(str(src))}"
        m = pack(src, dst, fmt, store=store, workers=2, **size)
        assert m["count"] == 12 and m["classes"] == ["0", "1", "2"] and not m["skipped"]
        assert verify(dst, deep=True).ok
        records = read_all(dst)
        assert sorted(r["txt"] for r in records) == sorted(s["txt"].decode() for s in theirs.values())
    one = pack(tmp_path / "gz" / "sw-000001.tar.gz", tmp_path / "one", "mmap", store="encoded", workers=1)
    ds = open_dataset(tmp_path / "one")
    assert one["count"] == 5
    for i in range(5):
        key = ds.key(i)
        assert np.array_equal(ds[i][0].permute(1, 2, 0).numpy(), decode(theirs[key]["jpg"], exact=True))
        assert int(ds[i][1]) == int(theirs[key]["cls"])


def test_tgz_members_are_bounded_and_a_cut_gzip_is_named(tmp_path, monkeypatch):
    from pixfeed.sources import shards

    src = tmp_path / "src"
    src.mkdir()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for i in range(4):
            add(tar, f"k{i}.jpg", jpeg(i))
            add(tar, f"k{i}.txt", b"x" * 5000)
    (src / "a.tgz").write_bytes(gzip.compress(raw.getvalue()))
    monkeypatch.setattr(shards, "MEMBER_BYTES", 4096)  # the limits of plain shards' members hold decompressed
    with pytest.raises(SourceError, match=r"a.tgz: member k0.txt: member of 5,000 bytes is over pixfeed's limit"):
        pack(src, tmp_path / "ds", "mmap", store="encoded", workers=1)
    monkeypatch.undo()
    data = gzip.compress(raw.getvalue())
    (src / "a.tgz").write_bytes(data[:len(data) // 2])
    with pytest.raises(SourceError, match=r"a.tgz: not a readable gzip-compressed tar shard, or it ends early"):
        pack(src, tmp_path / "ds", "mmap", store="encoded", workers=1)
    assert not (tmp_path / "ds").exists()


def test_tar_gz_shards_from_a_bucket(tmp_path, s3_server, bucket):
    from pixfeed.storage.store import Store

    gz_shards(tmp_path / "gz", count=7)
    store = Store(f"{bucket}/shards", s3_server.options)
    for p in sorted((tmp_path / "gz").iterdir()):
        store.write(p.name, p.read_bytes())
    m = pack(f"{bucket}/shards", tmp_path / "ds", "mmap", store="encoded", workers=1,
             storage_options=s3_server.options)
    assert m["count"] == 7 and verify(tmp_path / "ds").ok
    assert sorted(r["txt"] for r in read_all(tmp_path / "ds")) == sorted(f"caption {i}" for i in range(7))


# --- 8: COCO crowds (RLE) and category names in examples/coco_to_pixfeed.py ----------------------------------------


def uncompressed_rle(mask: np.ndarray) -> dict:
    """COCO's iscrowd form: run lengths of 0s then 1s, alternating, down the columns (column-major)."""
    flat = mask.T.reshape(-1).astype(np.uint8)
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    return {"counts": ([0] + runs) if flat[0] else runs, "size": list(mask.shape)}


def blobs(seed: int, shape=(37, 53)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mask = np.zeros(shape, np.uint8)
    for _ in range(4):
        y, x = rng.integers(0, shape[0] - 8), rng.integers(0, shape[1] - 8)
        mask[y:y + rng.integers(3, 12), x:x + rng.integers(3, 20)] = 1
    return mask


def test_rle_decodes_column_major_from_both_count_forms(coco):
    # 3 x 4, column-major: 2 zeros, 3 ones, 7 zeros -> (0,0) (1,0) are 0, (2,0) (0,1) (1,1) are 1
    got = coco.rle_decode({"counts": [2, 3, 7], "size": [3, 4]}, (3, 4))
    assert got.tolist() == [[0, 1, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0]]
    for seed in range(5):
        mask = blobs(seed)
        assert np.array_equal(coco.rle_decode(uncompressed_rle(mask), mask.shape), mask)
    with pytest.raises(ValueError, match=r"its RLE size is \[3, 4\] but its image is \[4, 3\]"):
        coco.rle_decode({"counts": [12], "size": [3, 4]}, (4, 3))
    with pytest.raises(ValueError, match="cover 11 pixels"):
        coco.rle_decode({"counts": [2, 3, 6], "size": [3, 4]}, (3, 4))


def test_rle_decode_agrees_with_pycocotools(coco):
    mask_api = pytest.importorskip("pycocotools.mask")
    for seed in range(8):
        mask = blobs(seed, (41 + seed, 29 + 3 * seed))
        h, w = mask.shape
        compressed = mask_api.encode(np.asfortranarray(mask))
        text = {"counts": compressed["counts"].decode("ascii"), "size": compressed["size"]}
        assert np.array_equal(coco.rle_decode(text, (h, w)), mask_api.decode(compressed))
        plain = uncompressed_rle(mask)
        theirs = mask_api.decode(mask_api.frPyObjects(plain, h, w))
        assert np.array_equal(coco.rle_decode(plain, (h, w)), theirs)


def test_crowd_annotations_pack_and_category_names_are_kept(coco, tmp_path):
    root = coco.make_sample(tmp_path / "sample", count=4)
    spec = json.loads((root / "annotations.json").read_text())
    crowds = {}
    for entry in spec["images"][:3]:
        h, w = entry["height"], entry["width"]
        region = np.zeros((h, w), np.uint8)
        region[h // 2:, : w // 3] = 1  # a crowd in the lower left, over whatever the polygons painted
        crowds[entry["file_name"]] = region
        rle = uncompressed_rle(region)
        if entry["id"] == 1:  # one in pycocotools' compressed form, when it is installed
            try:
                from pycocotools import mask as mask_api
                enc = mask_api.encode(np.asfortranarray(region))
                rle = {"counts": enc["counts"].decode("ascii"), "size": [h, w]}
            except ImportError:
                pass
        spec["annotations"].append({"id": 1000 + entry["id"], "image_id": entry["id"], "category_id": 2,
                                    "iscrowd": 1, "segmentation": rle, "bbox": [0, h // 2, w // 3, h - h // 2]})
    spec["categories"].append({"id": 7, "name": "seven"})
    (root / "annotations.json").write_text(json.dumps(spec))
    m = coco.convert(root / "annotations.json", root / "images", tmp_path / "ds", "mmap", store="encoded", workers=1)
    assert m["count"] == 4
    assert m["classes"] == ["background", "red", "green", "blue", "4", "5", "6", "seven"]  # 0: the masks' background
    ds = open_dataset(tmp_path / "ds", fields=None)
    for i in range(len(ds)):
        record = ds[i]
        name = f"{ds.key(i)}.png"
        if name in crowds:
            assert (record["mask"].numpy()[crowds[name].astype(bool)] == 2).all()


def test_an_input_that_fails_is_named_without_cutting_a_value(coco, tmp_path):
    root = coco.make_sample(tmp_path / "sample", count=2)
    spec = json.loads((root / "annotations.json").read_text())
    entry = spec["images"][0]
    entry.update(coco_url="http://images.cocodataset.org/train2017/000000000000.jpg", width=500)
    spec["annotations"].append({"id": 99, "image_id": entry["id"], "category_id": 1, "iscrowd": 1,
                                "segmentation": {"counts": [5], "size": [1, 5]}, "bbox": [0, 0, 5, 1]})
    (root / "annotations.json").write_text(json.dumps(spec))
    with pytest.raises(SourceError) as info:
        coco.convert(root / "annotations.json", root / "images", tmp_path / "ds", "mmap", store="encoded", workers=1)
    text = str(info.value)
    assert "its RLE size is [1, 5] but its image is" in text
    assert "'width': 5)" not in text and "'width': 5," not in text and "characters in all" in text


# --- 10: messages that say what is true -------------------------------------------------------------------------

def small_tree(root: Path, count: int = 12) -> Path:
    for i in range(count):
        path = root / ("cat", "dog")[i % 2] / f"{i}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg(i))
    return root


def test_the_wds_plan_says_how_crops_are_seeded_and_where_images_decode(tmp_path):
    from pixfeed.loaders import make_loader

    pack(small_tree(tmp_path / "src"), tmp_path / "wds", "wds", store="encoded", workers=1)
    plan = make_loader(open_dataset(tmp_path / "wds", size=16, crop="random"), 4, num_workers=1).pixfeed_plan
    assert plan.seeding == "per sample" and "(seed, epoch, record index)" in plan.reasons["seeding"]
    assert "no per-image decoding" not in plan.reasons["decode_threads"]
    assert "decodes each sample" in plan.reasons["decode_threads"] and "1 workers" not in plan.reasons["decode_threads"]
    plan = make_loader(open_dataset(tmp_path / "wds", size=16), 4, num_workers=0).pixfeed_plan
    assert plan.seeding == "none" and "draws no random numbers" in plan.reasons["seeding"]
    assert "in this process" in plan.reasons["decode_threads"]
    assert all(plan.reasons.get(name) for name in ("seeding", "decode_threads"))


def test_verify_does_not_tell_the_user_to_run_verify(tmp_path, capsys):
    pack(small_tree(tmp_path / "src"), tmp_path / "ds", "mmap", store="encoded", workers=1)
    data = tmp_path / "ds" / "data.bin"
    raw = bytearray(data.read_bytes())
    raw[700] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert main(["verify", str(tmp_path / "ds"), "-q"]) == 1
    out = capsys.readouterr().out
    assert "stored bytes fail their xxh3_64 checksum" in out and "pixfeed verify" not in out
    data.write_bytes(bytes(raw[:-100]))
    assert main(["verify", str(tmp_path / "ds"), "-q"]) == 1
    out = capsys.readouterr().out
    assert "truncated or damaged" in out and "pixfeed verify" not in out
    with pytest.raises(Exception, match=r"run 'pixfeed verify"):  # reading still points to the command
        ds = open_dataset(tmp_path / "ds")
        [ds[i] for i in range(len(ds))]


# --- 11: the default order of a bucket dataset larger than its cache -------------------------------------------

def test_auto_order_reads_a_bucket_dataset_larger_than_its_cache_quasi_randomly(tmp_path, s3_server, bucket):
    from pixfeed.loaders import make_loader
    from pixfeed.manifest import read_manifest

    src = small_tree(tmp_path / "src", count=120)
    url = f"{bucket}/ds"
    pack(src, url, "mmap", size=32, workers=1, storage_options=s3_server.options)
    limit = sum(m["bytes"] for m in read_manifest(url, s3_server.options)["files"].values()) // 4

    def opened(name):
        return open_dataset(url, size=16, storage_options=s3_server.options, cache_dir=tmp_path / name,
                            cache_limit=limit, chunk_bytes=8 << 10)

    ds = opened("auto")
    assert ds.chunks is not None and ds.chunks.count >= 20
    auto = make_loader(ds, 8, num_workers=0, seed=3)
    plan = auto.pixfeed_plan
    assert plan.order == "quasi_random" and plan.quasi is not None
    reason = plan.reasons["order"]
    assert "order='auto'" in reason and "a full shuffle would fetch" in reason and "order='random'" in reason
    full = make_loader(opened("random"), 8, num_workers=0, seed=3, order="random").pixfeed_plan
    assert full.order == "random" and "order='auto'" not in full.reasons["order"]
    assert plan.fetch["epoch_bytes"] < full.fetch["epoch_bytes"]  # the forecasts the reason compares
    assert f"{full.fetch['epoch_bytes'] / 2**20:,.1f} MiB" in reason
    labels = sorted(int(y) for _, ys in auto for y in ys)  # every record once
    assert labels == sorted(int(ds[i][1]) for i in range(len(ds)))
    ordered = make_loader(opened("auto"), 8, num_workers=0, shuffle=False).pixfeed_plan
    assert ordered.order == "random" and ordered.reasons["order"].startswith("shuffle=False")


def test_auto_order_is_the_full_shuffle_for_local_datasets(tmp_path):
    from pixfeed.loaders import make_loader

    pack(small_tree(tmp_path / "src"), tmp_path / "ds", "mmap", size=16, workers=1)
    plan = make_loader(open_dataset(tmp_path / "ds"), 4, num_workers=0).pixfeed_plan
    assert plan.order == "random" and plan.quasi is None and "order='auto'" in plan.reasons["order"]
