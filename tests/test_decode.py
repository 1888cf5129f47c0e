"""decode(): the exact path (exact=True) matches plain Pillow; the fast path (the default)
keeps the rules and geometry and stays within its documented PSNR tolerance."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from pixfeed.image import jpeghead as _jpeghead
from pixfeed.image.decode import decode
from pixfeed.errors import ImageDecodeError
from conftest import write_image


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def encode(tmp_path, size=(120, 90), mode="RGB", fmt="JPEG", seed=0, **save) -> bytes:
    return write_image(tmp_path / f"img.{fmt.lower()}", size=size, mode=mode, fmt=fmt, seed=seed, **save).read_bytes()


def both(data: bytes, **kw):
    exact = decode(data, rng=np.random.default_rng(7), exact=True, **kw)
    fast = decode(data, rng=np.random.default_rng(7), **kw)
    assert fast.shape == exact.shape and fast.dtype == np.uint8 and fast.flags.c_contiguous
    return exact, fast


def test_exact_path_is_plain_pillow(tmp_path):
    data = encode(tmp_path, size=(120, 90))
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((42, 32), Image.BILINEAR)  # int(32 * 120 / 90)
    want = np.asarray(img.crop((5, 0, 5 + 32, 32)))
    assert np.array_equal(decode(data, size=(32, 32), crop_ratio=1.0, exact=True), want)


@pytest.mark.parametrize("mode,fmt", [("RGB", "JPEG"), ("L", "JPEG"), ("CMYK", "JPEG"), ("RGB", "PNG"),
                                      ("RGBA", "PNG"), ("P", "PNG"), ("I;16", "PNG")])
@pytest.mark.parametrize("size,resize_mode", [((48, 48), "crop"), ((40, 64), "pad"), ((50, 30), "stretch")])
def test_fast_path_within_tolerance(tmp_path, mode, fmt, size, resize_mode):
    data = encode(tmp_path, size=(150, 100), mode=mode, fmt=fmt)
    exact, fast = both(data, size=size, resize_mode=resize_mode)
    assert psnr(exact, fast) >= 40


def test_fast_path_without_resize_is_exact(tmp_path):
    data = encode(tmp_path, size=(67, 45))
    exact, fast = both(data)
    assert np.array_equal(exact, fast)


@pytest.mark.parametrize("decoder", ["simplejpeg", "pillow"])
def test_dct_downscaling_within_tolerance(tmp_path, monkeypatch, decoder):
    if decoder == "pillow":
        monkeypatch.setattr(_jpeghead, "simplejpeg", None)
    data = encode(tmp_path, size=(640, 480), quality=95)
    exact, fast = both(data, size=(56, 56))  # 480 / 56 >= 8: decoded at 1/4 scale
    assert psnr(exact, fast) >= 35


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_on_fast_path(tmp_path, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(tmp_path, size=(90, 60), exif=exif.tobytes())
    exact, fast = both(data, size=(40, 30), resize_mode="stretch")
    assert psnr(exact, fast) >= 40
    assert _jpeghead.exif_orientation(data) == orientation
    assert _jpeghead.exif_orientation(memoryview(data)) == orientation  # a repack's view of data.bin


def test_xmp_orientation_goes_through_pillow(tmp_path):
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    data = encode(tmp_path, size=(90, 60), xmp=xmp)
    assert _jpeghead.exif_orientation(data) is None
    assert _jpeghead.exif_orientation(memoryview(np.frombuffer(data, np.uint8))) is None  # not a missed XMP run
    exact, fast = both(data)
    assert exact.shape == (90, 60, 3) and np.array_equal(exact, fast)


def test_random_crop_draws_like_the_exact_path(tmp_path):
    data = encode(tmp_path, size=(200, 150))
    r1, r2 = np.random.default_rng(3), np.random.default_rng(3)
    for _ in range(5):
        exact = decode(data, size=(32, 32), crop="random", rng=r1, exact=True)
        fast = decode(data, size=(32, 32), crop="random", rng=r2)
        assert psnr(exact, fast) >= 35
    assert r1.random() == r2.random()


@pytest.mark.parametrize("exact", [True, False])
def test_fast_path_keeps_the_safety_rules(tmp_path, exact):
    data = encode(tmp_path, size=(100, 80))
    with pytest.raises(ImageDecodeError, match="decompression-bomb"):
        decode(data, max_pixels=7999, exact=exact)
    with pytest.raises(ImageDecodeError, match="not a JPEG, PNG or WebP"):
        decode(b"GIF89a" + bytes(40), exact=exact)
    with pytest.raises(ImageDecodeError):
        decode(data[: len(data) // 2], exact=exact)


@pytest.mark.parametrize("orientation", [1, 6])
def test_check_encoded_takes_libjpeg_turbos_word_for_a_jpeg_the_fast_decoder_reads(tmp_path, monkeypatch,
                                                                                   orientation):
    """A pack's check of a YCbCr or gray JPEG reads its header with simplejpeg, not Pillow too; the
    limit, the end marker and the orientation hold as Pillow's check gave them.  CMYK, and a header
    libjpeg-turbo refuses, still go to Pillow (which names what is wrong)."""
    pytest.importorskip("simplejpeg")
    from pixfeed.image import decode as decoding

    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(tmp_path, size=(90, 60), exif=exif.tobytes())
    want = decoding.check_encoded(data, "x", full=True)  # decodes every pixel: Pillow's answer
    opened, real = [], Image.open
    monkeypatch.setattr(decoding.Image, "open", lambda *a, **k: opened.append(1) or real(*a, **k))
    assert decoding.check_encoded(data, "x") == want == ("JPEG", (90, 60) if orientation == 6 else (60, 90))
    assert decoding.check_encoded(encode(tmp_path, mode="L"), "x") == ("JPEG", (90, 120))
    assert opened == []
    with pytest.raises(ImageDecodeError, match="x: truncated JPEG"):
        decoding.check_encoded(data[:-2], "x")
    with pytest.raises(ImageDecodeError, match="x: 90x60 = 5400 pixels exceeds the decompression-bomb limit"):
        decoding.check_encoded(data, "x", max_pixels=5399)
    assert decoding.check_encoded(encode(tmp_path, mode="CMYK"), "x") == ("JPEG", (90, 120)) and opened
    with pytest.raises(ImageDecodeError, match="x: cannot read JPEG header"):
        decoding.check_encoded(data[:2] + b"\xff\xdb\x00\x03\x00" + data[2:], "x")


@pytest.mark.parametrize("channels", [3, 4])
@pytest.mark.parametrize("sliced", [False, True])
def test_channels_last_resize_equals_torchs_planar_output(channels, sliced):
    """resize_uint8 writes its output H x W x C (torch's kernel then skips repacking to planes):
    every pixel equals torch's own planar output, for RGB and RGBX, whole arrays and crop views."""
    import torch
    from pixfeed.image.fast import resize_uint8

    arr = np.random.default_rng(channels).integers(0, 256, (97, 131, channels), dtype=np.uint8)
    src = arr[5:90, 7:120] if sliced else arr
    for wh, scales in [((60, 45), (45 / src.shape[0], 60 / src.shape[1])), ((200, 150), (1.5, 1.6))]:
        out = resize_uint8(src, wh, scales)
        planar = torch.ops.aten._upsample_bilinear2d_aa(
            torch.from_numpy(np.ascontiguousarray(src)).permute(2, 0, 1).unsqueeze(0).contiguous(),
            [wh[1], wh[0]], False, *scales)
        assert out.shape == (wh[1], wh[0], channels) and out.flags.c_contiguous
        assert np.array_equal(out, planar[0].permute(1, 2, 0).numpy())


def test_center_crops_resize_only_up_to_the_kept_window():
    """finish() leaves out what lies right of and below a center crop's window (when shrinking):
    every pixel equals resizing the whole image and then cropping, shrinking or enlarging."""
    import torch
    from pixfeed.image import geometry
    from pixfeed.image.fast import finish, kept, resize_uint8

    assert kept(100, 200, 1000, 0.2) == (100, 504) and kept(100, 200, 150, 1.5) == (200, 150)
    rng = np.random.default_rng(5)
    for _ in range(150):
        h, w = (int(v) for v in rng.integers(12, 500, 2))
        arr = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
        size = tuple(int(v) for v in rng.integers(4, 300, 2))
        for ratio in (224 / 256, 1.0):
            p = geometry.plan(w, h, size, "crop", "center", None, ratio)
            (sw, sh), (ox, oy) = p.scaled, p.offset
            whole = resize_uint8(arr, (sw, sh), (sh / h, sw / w)) if (sh, sw) != (h, w) else arr
            assert np.array_equal(finish(arr, 1, p, size), whole[oy:oy + size[0], ox:ox + size[1], :3])


def test_a_forked_child_resizes_a_crop_after_its_parent_used_torch_threads():
    """A crop's strided view is copied by NumPy, not on torch's OpenMP threads: a process forked after
    they started (a benchmark's decode processes) never gets them back and waited for ever."""
    import multiprocessing as mp
    import torch
    from pixfeed.image.fast import resize_uint8

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        arr = np.random.default_rng(0).integers(0, 256, (375, 500, 4), dtype=np.uint8)
        (torch.ones(2000, 2000) * 2).sum()  # the parent's OpenMP threads start
        resize_uint8(arr[:300, :420], (282, 240), (256 / 375, 341 / 500))
        ctx = mp.get_context("fork")
        child = ctx.Process(target=resize_uint8, args=(arr[:300, :420], (282, 240), (256 / 375, 341 / 500)))
        child.start()
        child.join(60)
        alive = child.is_alive()
        child.kill()
        assert not alive and child.exitcode == 0
    finally:
        torch.set_num_threads(threads)


def _shift(exact: np.ndarray, fast: np.ndarray) -> np.ndarray:
    """(x, y) by which ``fast`` is displaced from ``exact``, in output pixels (one Lucas-Kanade step on
    the images' mean channel, their borders left out)."""
    e, f = (a.astype(np.float64).mean(2)[2:-2, 2:-2] for a in (exact, fast))
    gy, gx = np.gradient(e)
    a = np.array([[np.sum(gx * gx), np.sum(gx * gy)], [np.sum(gx * gy), np.sum(gy * gy)]])
    return np.linalg.solve(a, [np.sum(gx * (e - f)), np.sum(gy * (e - f))])


def test_dct_scaled_random_crops_stay_on_their_box():
    """A random crop decoded at 1/2-1/8 scale renders the drawn box, not one rounded to that scale's grid
    (which moved it by up to a quarter of an output pixel, 0.32 measured here): within 1/16 of an output
    pixel of the exact path, so boxes and masks (which follow the plan) stay on the pixels."""
    from pixfeed.image import fast as fastdecode, geometry

    w, h = 960, 720
    noise = np.random.default_rng(0).integers(0, 256, (h // 16, w // 16), dtype=np.uint8)
    img = Image.fromarray(noise, "L").resize((w, h), Image.BICUBIC).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=100)
    data, worst, scaled = buf.getvalue(), 0.0, 0
    for seed in range(60):
        p = geometry.plan(w, h, (32, 32), crop="random", rng=np.random.default_rng(seed))
        d = fastdecode.dct_divisor(p)
        if d == 1 or not (p.box[0] % d or p.box[1] % d):
            continue
        scaled += 1
        shift = _shift(decode(data, size=(32, 32), plan=p, exact=True), decode(data, size=(32, 32), plan=p))
        worst = max(worst, float(np.abs(shift).max()))
    assert scaled >= 10 and worst <= 1 / 16, (scaled, worst)


@pytest.mark.parametrize("orientation", range(2, 9))
@pytest.mark.parametrize("wh", [(2, 1), (1, 2), (3, 1)])
def test_tiny_rotated_jpeg_random_crops_reach_torch(tmp_path, orientation, wh):
    """A JPEG of 1-3 pixels turned by its EXIF orientation: the flipped view has negative strides on axes
    of length 1, which np.ascontiguousarray keeps and torch refused (a raw ValueError every epoch)."""
    import torch
    from pixfeed.image import region as regiondecode

    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(tmp_path, size=wh, exif=exif.tobytes())
    for enabled in {False, regiondecode.available()}:
        regiondecode.ENABLED, saved = enabled, regiondecode.ENABLED
        try:
            for seed in range(4):
                arr = decode(data, size=(224, 224), crop="random", rng=np.random.default_rng(seed))
                assert torch.from_numpy(arr).shape == (224, 224, 3)
        finally:
            regiondecode.ENABLED = saved


def test_library_warnings_are_routed_per_thread_and_leave_the_process_as_it_was():
    """Decode threads each collect their own Pillow warnings; when the last leaves, Python's warnings
    filters and showwarning are what they were (a racing catch_warnings could leave a dead recorder)."""
    import threading
    import warnings
    from pixfeed.image.pillow import library_warnings

    filters, shown = list(warnings.filters), warnings.showwarning
    sinks, start = [[] for _ in range(4)], threading.Barrier(4)

    def work(sink, n):
        start.wait()
        for k in range(200):
            with library_warnings(sink):
                warnings.warn_explicit(f"thread {n} warning {k}", UserWarning, "/x/PIL/Fake.py", 1, module="PIL.Fake")
    threads = [threading.Thread(target=work, args=(s, n)) for n, s in enumerate(sinks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [len(s) for s in sinks] == [200] * 4
    assert all(all(f"thread {n} " in text for text in s) for n, s in enumerate(sinks))
    assert warnings.filters == filters and warnings.showwarning is shown
