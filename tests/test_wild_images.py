"""Images as they come in the wild: every valid oddity packs and reads back
pixel-identical to a Pillow reference, in every format and store mode; every
kind of bad input is refused naming the file, or skipped on request."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import write_image, sized
from reference import reference_pixels, reference_rgb
from torch.utils.data import IterableDataset
from wild import BAD, png_bytes, write_bad, write_good

from pixfeed import registry
from pixfeed.datasets import open_dataset
from pixfeed.image.decode import decode
from pixfeed.errors import PixfeedError
from pixfeed.packers import pack
from pixfeed.sources.folder import scan
from pixfeed.verify.check import verify

SIZE = 24
CASES = [(f, s) for f in sorted(registry.FORMATS) for s in ("pixels", "encoded")]


@pytest.fixture(scope="module")
def wild_src(tmp_path_factory) -> Path:
    return write_good(tmp_path_factory.mktemp("wild") / "src")


def _fingerprint(image, label: int) -> tuple:
    arr = np.asarray(image)
    return label, arr.shape, arr.tobytes()


def _reference(src: Path, store: str) -> dict:
    """key -> fingerprint of the (H, W, 3) reference as the dataset returns it (CHW)."""
    source = scan(src)
    out = {}
    for path, key, label in zip(source.paths, source.keys, source.labels):
        ref = reference_pixels(src / path, SIZE) if store == "pixels" else np.asarray(reference_rgb(src / path))
        out[key] = _fingerprint(ref.transpose(2, 0, 1), int(label))
    return out


@pytest.mark.parametrize("fmt,store", CASES)
def test_wild_images_round_trip_pixel_exact(wild_src, tmp_path, fmt, store):
    dst = tmp_path / "ds"
    m = pack(wild_src, dst, fmt, store=store, **sized(store, SIZE), workers=1)
    want = _reference(wild_src, store)
    assert m["count"] == len(want) and m["skipped"] == []
    assert m["classes"] == ["jpeg v1.0", "odd names", "png.set"]
    assert any("png named.jpg: is a PNG file despite its .jpg name" in n for n in m["notes"]), m["notes"]
    ds = open_dataset(dst)
    if isinstance(ds, IterableDataset):  # stream order: compare as multisets, keys from keys.json
        got = Counter(_fingerprint(img, label) for img, label in ds)
        keys = json.loads((dst / "keys.json").read_text(encoding="utf-8"))
        wrong = [k for k in keys if got[want[k]] == 0]
        assert not wrong and got == Counter(want.values()), f"{fmt}/{store}: differ from the reference: {wrong}"
    else:
        wrong = [ds.key(i) for i in range(len(ds)) if _fingerprint(*ds[i]) != want[ds.key(i)]]
        assert not wrong, f"{fmt}/{store}: differ from the reference: {wrong}"
    report = verify(dst, deep=True)
    assert report.ok and report.records == len(want), report.problems


def test_exif_orientation_is_applied_to_shape(wild_src):
    for k in range(2, 9):
        path = wild_src / "jpeg v1.0" / "exif" / f"orientation-{k}.jpg"
        assert decode(path.read_bytes()).shape == ((40, 24, 3) if k >= 5 else (24, 40, 3)), k


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_16_bit_png_keeps_the_high_byte(channels):
    rng = np.random.default_rng(channels)
    arr = rng.integers(0, 65536, (5, 7, channels), dtype=np.uint16)
    high = (arr >> 8).astype(np.uint8)
    want = np.repeat(high, 3, axis=2) if channels == 1 else high[..., :3]
    assert np.array_equal(decode(png_bytes(arr)), want)


def _one_bad(root: Path, case: str) -> Path:
    write_image(root / "bad" / "good.jpg", fmt="JPEG")
    return write_bad(root, case)


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("fmt,store", CASES)
def test_bad_input_is_refused_naming_the_file(tmp_path, case, fmt, store):
    bad = _one_bad(tmp_path / "src", case)
    with pytest.raises(PixfeedError) as err:
        pack(tmp_path / "src", tmp_path / "ds", fmt, store=store, **sized(store, SIZE), workers=1)
    msg = str(err.value)
    named = [p for p in (bad, bad.with_name("loop-b.jpg")) if str(p) in msg]
    assert named and BAD[case][1].lower() in msg.lower(), msg
    assert sorted(os.listdir(tmp_path)) == ["src"], "a failed pack left output behind"


@pytest.mark.parametrize("fmt,store", CASES)
def test_bad_input_is_skipped_on_request(tmp_path, fmt, store):
    src, dst = tmp_path / "src", tmp_path / "ds"
    write_image(src / "ok" / "a.jpg", fmt="JPEG")
    write_image(src / "ok" / "b.png", fmt="PNG", seed=1)
    for case in BAD:
        write_bad(src, case)
    m = pack(src, dst, fmt, store=store, **sized(store, SIZE), workers=1, on_error="skip")
    reasons = {s["path"]: s["reason"] for s in m["skipped"]}
    assert m["count"] == 2 and len(reasons) == len(BAD) + 1  # the loop is two links
    for case, (_, fragment) in BAD.items():
        path = next(p for p in reasons if Path(p).stem == case)
        assert fragment.lower() in reasons[path].lower(), reasons[path]
    assert verify(dst, deep=True).ok


def test_max_pixels_option_sets_the_bomb_limit(tmp_path):
    write_image(tmp_path / "src" / "x.png", size=(40, 30), fmt="PNG")
    with pytest.raises(PixfeedError, match=r"x\.png: 40x30 = 1200 pixels exceeds .* limit of 1000 .*--max-pixels"):
        pack(tmp_path / "src", tmp_path / "ds", "mmap", max_pixels=1000, workers=1)
    assert pack(tmp_path / "src", tmp_path / "ds", "mmap", max_pixels=1200, workers=1)["count"] == 1
    cli = [sys.executable, "-m", "pixfeed.cli", "pack", str(tmp_path / "src"), str(tmp_path / "d2"), "-q"]
    refused = subprocess.run([*cli, "--max-pixels", "1199"], capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "x.png: 40x30 = 1200 pixels exceeds" in refused.stderr


def _unprivileged(fn) -> str:
    """Run ``fn`` as the user nobody in a forked child (root reads any file); return its error text.

    The child uses only modules the parent already imported (root's Python
    install is not readable by nobody)."""
    if os.geteuid() != 0:
        try:
            fn()
            return ""
        except PixfeedError as e:
            return str(e)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        msg = ""
        try:
            os.setgroups([]), os.setgid(65534), os.setuid(65534)
            fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            msg = f"{type(e).__name__}: {e}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    os.waitpid(pid, 0)
    return msg


def test_unreadable_file_is_refused_naming_it():
    work = Path(tempfile.mkdtemp(prefix="pixfeed-perm-"))  # under /tmp, so nobody can reach it
    try:
        work.chmod(0o777)
        write_image(work / "src" / "c" / "ok.jpg", fmt="JPEG")
        locked = write_image(work / "src" / "c" / "locked.jpg", fmt="JPEG", seed=1)
        locked.chmod(0)
        if os.geteuid() == 0:  # root can read it: the pack succeeds (and imports what the child needs)
            assert pack(work / "src", work / "as-root", "mmap", workers=1)["count"] == 2
        msg = _unprivileged(lambda: pack(work / "src", work / "ds", "mmap", workers=1))
        assert f"SourceError: {locked}: cannot read (Permission denied)" in f"SourceError: {msg}", msg
        assert not (work / "ds").exists()
    finally:
        shutil.rmtree(work)
