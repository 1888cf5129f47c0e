"""Data as other tools write it (issue 38): WebP images (img2dataset's --encode_format webp), tar shards whose
members are not next to each other (a plain ``tar -cf``), gzip-compressed shards, COCO crowd annotations (RLE),
and the loader's plan and ``pixfeed verify`` saying what is true."""
from __future__ import annotations

import gzip
import io
import json
import subprocess
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
