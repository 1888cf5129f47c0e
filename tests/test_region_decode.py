"""Region decode (optional extra pixfeed[region]): the random box decoded alone is the
same box of the image, pixel for pixel, in every orientation and JPEG kind; random
crops keep their geometry and RNG draws; full decodes taken instead are counted."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image, ImageOps

from pixfeed.image import region as _regiondecode
from pixfeed.image.decode import decode
from pixfeed.errors import ImageDecodeError
from conftest import write_image

pytestmark = pytest.mark.skipif(not _regiondecode.ENABLED,
                                reason="nvidia-nvimgcodec-cu12 not installed (pip install 'pixfeed[region]')")
KINDS = [("RGB", {}), ("L", {}), ("RGB", {"progressive": True}), ("RGB", {"subsampling": 0})]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def jpeg(tmp_path, size, mode="RGB", orientation=1, **save) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = write_image(tmp_path / "a.jpg", size=size, mode=mode, seed=sum(size), exif=exif.tobytes(), **save)
    return path.read_bytes()


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("mode,save", KINDS, ids=["rgb", "gray", "progressive", "444"])
def test_box_is_the_same_box_of_the_oriented_image(tmp_path, orientation, mode, save):
    data = jpeg(tmp_path, (67, 45), mode, orientation, **save)
    full = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    box = (5, 3, 36, 40) if orientation > 4 else (7, 4, 60, 31)  # within the oriented image, odd offsets
    raw = _regiondecode.decode_box(data, box, 67, 45, orientation)
    got = np.asarray(ImageOps.exif_transpose(_with_orientation(raw, orientation)))
    np.testing.assert_array_equal(got, np.asarray(full.crop(box)))


def _with_orientation(arr: np.ndarray, orientation: int) -> Image.Image:
    img = Image.fromarray(arr)
    exif = img.getexif()
    exif[0x0112] = orientation
    img.info["exif"] = exif.tobytes()
    return img


@pytest.mark.parametrize("size", [(101, 75), (75, 101)])
@pytest.mark.parametrize("orientation", [1, 6])
def test_random_crops_keep_geometry_and_draws(tmp_path, monkeypatch, size, orientation):
    data = jpeg(tmp_path, size, orientation=orientation)
    before = _regiondecode.stats().get("region", 0)
    rngs = [np.random.default_rng(4) for _ in range(3)]
    exact = [decode(data, size=(24, 20), crop="random", rng=rngs[0], exact=True) for _ in range(6)]
    region = [decode(data, size=(24, 20), crop="random", rng=rngs[1]) for _ in range(6)]
    assert _regiondecode.stats()["region"] == before + 6
    monkeypatch.setattr(_regiondecode, "ENABLED", False)
    whole = [decode(data, size=(24, 20), crop="random", rng=rngs[2]) for _ in range(6)]
    assert len({r.random() for r in rngs}) == 1  # the same draws on every path
    for e, r, w in zip(exact, region, whole):
        assert psnr(e, r) >= 35 and psnr(w, r) >= 35


def test_cmyk_and_center_crops_decode_whole(tmp_path):
    before = _regiondecode.stats()
    cmyk = jpeg(tmp_path, (90, 70), "CMYK")
    assert psnr(decode(cmyk, size=(24, 24), crop="random", rng=np.random.default_rng(1)),
                decode(cmyk, size=(24, 24), crop="random", rng=np.random.default_rng(1), exact=True)) >= 35
    decode(jpeg(tmp_path, (90, 70)), size=(24, 24))
    assert _regiondecode.stats() == before


def test_full_decodes_taken_instead_are_counted(tmp_path):
    before = _regiondecode.stats()
    big = jpeg(tmp_path, (640, 480), quality=95)  # boxes >= 2x the 16 px output: DCT-scaled full decode
    rng = np.random.default_rng(0)
    for _ in range(5):
        decode(big, size=(16, 16), crop="random", rng=rng)
    assert _regiondecode.stats()["full: DCT scaling"] == before.get("full: DCT scaling", 0) + 5
    with pytest.raises(ImageDecodeError):
        decode(big[: len(big) // 3], size=(300, 300), crop="random", rng=rng)
    refused = "full: nvimgcodec refused the stream"
    assert _regiondecode.stats()[refused] == before.get(refused, 0) + 1


def _decode_in_child(data: bytes) -> tuple:
    out = decode(data, size=(24, 20), crop="random", rng=np.random.default_rng(9))
    return out, _regiondecode.stats()["region"]


def test_forked_workers_get_their_own_decoder(tmp_path):
    import multiprocessing
    data = jpeg(tmp_path, (101, 75))
    want = decode(data, size=(24, 20), crop="random", rng=np.random.default_rng(9))  # the parent's decoder exists
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got, count = pool.apply(_decode_in_child, (data,))
    assert np.array_equal(got, want) and count >= 1


def test_threads_get_their_own_decoder(tmp_path, capfd):
    """One nvimgcodec decoder is not thread-safe (shared, it printed 'Broken promise' and fell back)."""
    from concurrent.futures import ThreadPoolExecutor
    data = jpeg(tmp_path, (301, 213))
    crops = lambda k: decode(data, size=(48, 40), crop="random", rng=np.random.default_rng(k))  # noqa: E731
    want = [crops(k) for k in range(64)]
    before = _regiondecode.stats().get("region", 0)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(crops, range(64)))
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert _regiondecode.stats().get("region", 0) > before  # the threads decoded regions, not fallbacks
    assert "nvimgcodec" not in capfd.readouterr().err


def test_the_decoder_says_nothing_about_missing_cuda_libraries(tmp_path):
    """On a machine without CUDA nvimgcodec prints six [ERROR] lines when imported: they are held back."""
    import subprocess
    import sys

    write_image(tmp_path / "src" / "a.jpg", size=(64, 48))
    code = ("import pixfeed, torch; ds = pixfeed.open_dataset(sys.argv[1], size=16, crop='random');"
            "[ds[i] for i in range(len(ds))]; from pixfeed.image import region as r; print(r.stats())")
    from pixfeed import pack

    pack(tmp_path / "src", tmp_path / "ds", "mmap", store="encoded")
    done = subprocess.run([sys.executable, "-c", "import sys; " + code, str(tmp_path / "ds")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "region" in done.stdout  # the region decoder ran
    assert "[ERROR]" not in done.stderr and "nvjpeg" not in done.stderr.lower(), done.stderr


def test_quietly_passes_other_output_on(capfd):
    import os

    from pixfeed.image.region import quietly

    def noisy():
        os.write(2, b"\x1b[0;31m[ERROR] \x1b[0m[nvjpeg-ext] Failed to load nvJPEG library or retrieve version. "
                    b"Decoders and encoders will not be registered.\n")
        os.write(2, b"a real problem\n")
        os.write(1, b"Failed to load nvtiff library! Please install nvTIFF\n")
        return 7

    assert quietly(noisy) == 7
    out, err = capfd.readouterr()
    assert err == "a real problem\n" and out == ""
