"""Typed fields: every source kind x format x store round trips every field; the stock readers read them."""
from __future__ import annotations

import io
import json
import struct

import h5py
import lmdb
import numpy as np
import pytest
import torch
import webdataset
from PIL import Image

import pixfeed
from pixfeed.cli import main as cli
from pixfeed.errors import CorruptDataError, OptionError
from fieldtree import FIELDS, make_field_tree, rows, scene
from reference import center_crop_box, resize_shape

FORMATS = ("mmap", "lmdb", "hdf5", "wds")
SOURCES = ("index.csv", "index.jsonl", "paths.parquet", "hf.parquet")
N, SIZE = 6, 32


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_field_tree(tmp_path_factory.mktemp("fields"), N)


def pack(tree, dst, fmt, store, index="index.csv", extra=(), **kw):
    args = ["pack", "-q", "--workers", "1", "--format", fmt, "--store", store, "--index", str(tree / index),
            "--class-column", "label", *FIELDS, *extra, str(tree), str(dst)]
    if store == "pixels":
        args[1:1] = ["--size", str(SIZE)]
    assert cli(args) == 0
    return dst


def nearest_crop(mask: np.ndarray, size: int) -> np.ndarray:
    """torchvision Resize(size, NEAREST) + CenterCrop(size), from the formulas in tests/reference.py."""
    h, w = mask.shape
    img = Image.fromarray(mask).resize(resize_shape(w, h, size), Image.NEAREST)
    return np.asarray(img.crop(center_crop_box(*img.size, size, size)))


def boxes_crop(boxes, w: int, h: int, size: int):
    """Boxes through Resize(size) + CenterCrop(size): scaled, shifted, clipped; empty ones dropped."""
    rw, rh = resize_shape(w, h, size)
    left, top, _, _ = center_crop_box(rw, rh, size, size)
    out = np.array(boxes, np.float64) * [rw / w, rh / h, rw / w, rh / h] - [left, top, left, top]
    out = np.clip(out, 0, size)
    keep = (out[:, 2] > out[:, 0]) & (out[:, 3] > out[:, 1])
    return out[keep].astype(np.float32), keep


@pytest.mark.parametrize("store", ["encoded", "pixels"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("index", SOURCES)
def test_every_field_round_trips(tree, tmp_path, index, fmt, store):
    ds_path = pack(tree, tmp_path / "ds", fmt, store, index)
    ds = pixfeed.open_dataset(ds_path, fields=None, shuffle=False) if fmt == "wds" else \
        pixfeed.open_dataset(ds_path, fields=None)
    got = list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))]
    assert len(got) == N
    by_caption = {g["caption"]: g for g in got}
    for i, row in enumerate(rows(N)):
        g = by_caption[row["caption"]]
        image, mask, boxes, classes = scene(i)
        assert g["label"] == ["cat", "dog"].index(row["label"])
        assert g["score"] == row["score"] and g["count"] == row["count"] and g["meta"] == row["meta"]
        assert g["tags"].tolist() == row["tags"] and g["tags"].dtype == torch.int64
        assert torch.equal(g["emb"], torch.tensor(row["emb"], dtype=torch.float32))
        h, w = mask.shape
        if store == "encoded":
            assert torch.equal(g["image"], torch.from_numpy(image).permute(2, 0, 1))
            assert np.array_equal(g["mask"].numpy(), mask)
            assert g["boxes"].tolist() == boxes and g["box_cls"].tolist() == classes
        else:
            assert np.array_equal(g["mask"].numpy(), nearest_crop(mask, SIZE))
            want, keep = boxes_crop(boxes, w, h, SIZE)
            assert np.allclose(g["boxes"].numpy(), want, atol=1e-4)
            assert g["box_cls"].tolist() == np.array(classes)[keep].tolist()


def test_schema_and_info(tree, tmp_path, capsys):
    m = pixfeed.read_manifest(pack(tree, tmp_path / "ds", "mmap", "encoded", "index.jsonl"))
    types = {f["name"]: f["type"] if f["type"] != "ndarray" else (f["dtype"], f["shape"]) for f in m["schema"]}
    assert types == {"caption": "str", "score": "float", "count": "int", "meta": "json",
                     "tags": ("int64", [None]), "emb": ("float32", [3]), "mask": "mask", "boxes": "boxes",
                     "box_cls": ("int64", [None])}
    assert m["classes"] == ["cat", "dog"] and m["per_box"] == ["box_cls"] and m["source"]["kind"] == "index"
    assert cli(["info", str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert "emb (float32[3])" in out and "tags (int64[N])" in out and "index.jsonl" in out


def test_tuples_in_the_order_asked_and_unknown_fields_named(tree, tmp_path):
    path = pack(tree, tmp_path / "ds", "lmdb", "encoded")
    ds = pixfeed.open_dataset(path, fields=("caption", "count", "label"))
    assert ds[1] == ("caption 1 é", -1, 1)
    with pytest.raises(OptionError, match="no field 'nope'.*has image, label, caption"):
        pixfeed.open_dataset(path, fields=("caption", "nope"))
    plain = pixfeed.open_dataset(path, size=16)  # the default stays (image, label)
    image, label = plain[0]
    assert image.shape == (3, 16, 16) and label == 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_caption_read_never_touches_the_image(tree, tmp_path, fmt):
    """The image's stored bytes are damaged: reading them fails, reading the caption does not."""
    path = pack(tree, tmp_path / "ds", fmt, "encoded")
    if fmt == "wds":
        return _damaged_wds_caption(path)
    flip_image_byte(path, fmt)
    captions = pixfeed.open_dataset(path, fields=("caption",))
    assert [captions[i][0] for i in range(N)] == [f"caption {i} é" for i in range(N)]
    with pytest.raises(CorruptDataError, match="checksum"):
        [pixfeed.open_dataset(path)[i] for i in range(N)]


def flip_image_byte(path, fmt) -> None:
    if fmt == "mmap":
        target = path / "data.bin"
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
    elif fmt == "hdf5":
        with h5py.File(path / "data.h5", "r+") as f:
            row = f["encoded"][0].copy()
            row[len(row) // 2] ^= 0xFF
            f["encoded"][0] = row
        return
    else:
        env = lmdb.open(str(path / "data.mdb"), subdir=False, readonly=True, lock=False)
        value = bytes(env.begin().get(b"%010d" % 0))
        env.close()
        image = value[40:40 + struct.unpack_from("<Q", value, 32)[0]]
        return flip_in_file(path / "data.mdb", image, len(image) // 2)
    target.write_bytes(bytes(data))


def flip_in_file(path, needle: bytes, at: int) -> None:
    """Flip one byte of every copy of ``needle`` in the file (LMDB may keep a stale page), in place."""
    data = bytearray(path.read_bytes())
    start = data.find(needle)
    assert start >= 0
    while start >= 0:
        data[start + at] ^= 0x01
        start = data.find(needle, start + 1)
    path.write_bytes(bytes(data))


def _damaged_wds_caption(path):
    ds = pixfeed.open_dataset(path, fields=("caption",), shuffle=False, checksums=True)
    assert sorted(c for (c,) in ds) == sorted(f"caption {i} é" for i in range(N))


@pytest.mark.parametrize("fmt", ["mmap", "hdf5", "lmdb"])
def test_a_flipped_field_byte_is_caught(tree, tmp_path, fmt):
    path = pack(tree, tmp_path / "ds", fmt, "pixels")
    if fmt == "mmap":
        target = path / "fields/caption.bin"
        data = bytearray(target.read_bytes())
        data[3] ^= 0x01
        target.write_bytes(bytes(data))
    elif fmt == "hdf5":
        with h5py.File(path / "data.h5", "r+") as f:
            f["fields/caption"][0] = "caption 0 e"
    else:
        flip_in_file(path / "data.mdb", "caption 0 é".encode(), 3)
    ds = pixfeed.open_dataset(path, fields=("caption",))
    with pytest.raises(CorruptDataError, match="record 0.*field caption.*checksum"):
        ds[0]
    assert pixfeed.open_dataset(path, fields=("caption",), checksums=False)[1] == ("caption 1 é",)


def test_stock_readers_read_the_fields(tree, tmp_path):
    # WebDataset: K.NAME.EXT members, decoded by extension
    wds_path = pack(tree, tmp_path / "wds", "wds", "encoded", extra=["--no-shuffle"])
    shards = sorted(str(p) for p in wds_path.glob("*.tar"))
    samples = list(webdataset.WebDataset(shards, shardshuffle=False))
    s = samples[1]
    assert s["caption.txt"].decode() == "caption 1 é" and json.loads(s["meta.json"]) == {"i": 1, "names": ["x"]}
    assert np.load(io.BytesIO(s["boxes.npy"])).tolist() == scene(1)[2]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(s["mask.png"]))), scene(1)[1])
    assert int(s["count.cls"]) == -1 and float(s["score.txt"]) == 0.75
    # numpy: fixed-shape fields are one .npy, variable ones bytes + offsets
    mm = pack(tree, tmp_path / "mm", "mmap", "pixels")
    assert np.load(mm / "fields/count.npy", mmap_mode="r").tolist() == [i - 2 for i in range(N)]
    assert np.load(mm / "fields/emb.npy", mmap_mode="r").shape == (N, 3)
    assert np.load(mm / "fields/mask.npy", mmap_mode="r").shape == (N, SIZE, SIZE)
    offsets = np.load(mm / "fields/caption.offsets.npy")
    text = (mm / "fields/caption.bin").read_bytes()
    assert text[offsets[2]:offsets[3]].decode() == "caption 2 é"
    # h5py
    h5 = pack(tree, tmp_path / "h5", "hdf5", "encoded")
    with h5py.File(h5 / "data.h5", "r") as f:
        assert f["fields/caption"][3].decode() == "caption 3 é"
        assert f["fields/boxes"][2].reshape(-1, 4).tolist() == scene(2)[2]
    # lmdb: the record layout's field table, in schema order
    lm = pack(tree, tmp_path / "lm", "lmdb", "encoded")
    schema = [f["name"] for f in pixfeed.read_manifest(lm)["schema"]]
    env = lmdb.open(str(lm / "data.mdb"), subdir=False, readonly=True, lock=False)
    value = env.begin().get(b"%010d" % 4)
    n = struct.unpack_from("<4sBBHqQIIQ", value)[-1]
    pos, fields = 40 + n + 4, {}
    for name in schema:
        size, _ = struct.unpack_from("<IQ", value, pos)
        fields[name] = value[pos + 12:pos + 12 + size]
        pos += 12 + size
    assert fields["caption"].decode() == "caption 4 é" and struct.unpack("<q", fields["count"])[0] == 2


def test_make_loader_collates_fields(tree, tmp_path):
    path = pack(tree, tmp_path / "ds", "mmap", "encoded")
    ds = pixfeed.open_dataset(path, fields=("image", "caption", "boxes", "mask", "count"), size=24)
    image, caption, boxes, mask, count = next(iter(pixfeed.make_loader(ds, 4, num_workers=0, shuffle=False)))
    assert image.shape == (4, 3, 24, 24) and mask.shape == (4, 24, 24) and count.tolist() == [-2, -1, 0, 1]
    assert caption == [f"caption {i} é" for i in range(4)]
    assert isinstance(boxes, list) and all(b.shape[1:] == (4,) for b in boxes)


def test_datasets_without_fields_still_open(image_tree, tmp_path):
    """A layout-version-1 manifest (packed before fields existed: no schema) opens as before."""
    pixfeed.pack(image_tree, tmp_path / "ds", "mmap", size=8, workers=1)
    m = json.loads((tmp_path / "ds/pixfeed.json").read_text())
    for key in ("schema", "per_box", "source"):
        del m[key]
    m["layout_version"] = 1
    (tmp_path / "ds/pixfeed.json").write_text(json.dumps(m))
    ds = pixfeed.open_dataset(tmp_path / "ds")
    assert ds[0][0].shape == (3, 8, 8) and pixfeed.open_dataset(tmp_path / "ds", fields=None)[0].keys() == {"image", "label"}


def test_image_and_caption_batches_are_one_gathered_read(tree, tmp_path):
    path = pack(tree, tmp_path / "ds", "mmap", "pixels")
    ds = pixfeed.open_dataset(path, fields=("image", "caption", "emb"), size=24)
    loader = pixfeed.make_loader(ds, 3, num_workers=0, shuffle=False)
    assert loader.pixfeed_plan.path == "batch"
    images, captions, emb = next(iter(loader))
    one = [ds[i] for i in range(3)]
    assert torch.equal(images, torch.stack([o[0] for o in one])) and captions == [o[1] for o in one]
    assert torch.equal(emb, torch.stack([o[2] for o in one]))
    masks = pixfeed.open_dataset(path, fields=("image", "mask"), size=24)  # follows the image: per sample
    assert pixfeed.make_loader(masks, 3, num_workers=0).pixfeed_plan.path == "samples"


@pytest.mark.parametrize("fmt", ["mmap", "wds"])
def test_verify_checks_every_field(tree, tmp_path, fmt):
    from pixfeed.verify.check import verify

    path = pack(tree, tmp_path / "ds", fmt, "encoded")
    assert verify(path, deep=True).ok
    if fmt == "mmap":
        target = path / "fields/caption.bin"
        data = bytearray(target.read_bytes())
        data[3] ^= 0x01
        target.write_bytes(bytes(data))
    else:
        flip_in_file(next(path.glob("*.tar")), "caption 2 é".encode(), 2)
    problems = verify(path, deep=True).problems
    assert any("caption" in p for p in problems) if fmt == "mmap" else problems


@pytest.mark.parametrize("store", ["encoded", "pixels"])
def test_wds_shard_bytes_bound_counts_the_fields(tree, tmp_path, store):
    path = pack(tree, tmp_path / "ds", "wds", store, extra=["--shard-bytes", "40960"])
    shards = pixfeed.read_manifest(path)["shards"]
    assert len(shards) > 1 and all(s["bytes"] <= 40960 for s in shards)
