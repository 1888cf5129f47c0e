"""Region decode for random-resized crops: decode only the box a crop keeps.

With the optional extra ``pixfeed[region]`` (nvidia-nvimgcodec-cu12, whose CPU
backend runs libjpeg-turbo's ``jpeg_crop_scanline`` + ``jpeg_skip_scanlines``,
no GPU needed), the fast path decodes a ``crop="random"`` box of a JPEG that
``_jpeghead.probe`` accepts (YCbCr or grayscale, baseline or progressive)
instead of the whole image, then resizes it as before.  Without the extra, or
where it does not apply, the full decode of ``_fastdecode`` runs:

* a box at least ``DCT_MARGIN`` x the output is decoded whole at 1/2-1/8 scale
  (nvimgcodec has no DCT scaling, and the scaled full decode is faster),
* center crops keep the whole decode (the 224/256 box is 58% of an ImageNet
  photo: region decode measured no faster, benchmarks/bench_region_decode.py),
* a stream nvimgcodec refuses (it returns None) goes to the full decode.

Its pixels are libjpeg-turbo's accurate IDCT with fancy upsampling, identical
to Pillow's decode of the same rows and columns; the box and the RNG draws are
those of ``geometry.plan``, so geometry is unchanged.  ``stats()`` counts, in
this process, the region decodes and the full decodes taken instead, by reason.
On a machine without CUDA libraries nvimgcodec prints, when it is imported
and its decoder made, six red ``[ERROR]`` lines about missing nvJPEG,
nvJPEG2000 and nvTIFF: harmless (the CPU backend needs none), but they read as
a failure, so ``quietly`` captures that output and passes on only other lines.
"""
from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Optional, Tuple

import numpy as np

_STATS: Counter = Counter()
_decoder = threading.local()  # one decoder per thread (one is not thread-safe) and process (never across fork)


def available() -> bool:
    """Whether nvidia-nvimgcodec is installed (imported on first use only)."""
    from importlib.util import find_spec
    try:
        return find_spec("nvidia.nvimgcodec") is not None
    except ModuleNotFoundError:
        return False


ENABLED = available()


def stats() -> dict:
    """Counts in this process: ``region`` decodes, and ``full: <reason>`` decodes taken instead."""
    return dict(_STATS)


def count(what: str) -> None:
    _STATS[what] += 1


def _codec():
    if getattr(_decoder, "pid", None) != os.getpid():
        _decoder.codec, _decoder.pid = quietly(_make_codec), os.getpid()
    return _decoder.codec


def _make_codec():
    from nvidia import nvimgcodec as n
    decoder = n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                        backends=[n.Backend(n.BackendKind.CPU_ONLY)])
    params = n.DecodeParams(color_spec=n.SRGB, sample_format=n.I_RGB, apply_exif_orientation=False)
    return n, decoder, params


# what nvimgcodec prints about the CUDA libraries its GPU backends would use (lower case)
MISSING_CUDA = ("failed to load nvjpeg", "failed to load nvtiff", "nvimagecodec's python distribution",
                "decoders and encoders will not be registered")


def quietly(make):
    """``make()`` with this process's stdout and stderr captured; every line but nvimgcodec's notes on
    missing CUDA libraries is written to stderr after it."""
    import sys
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 1)
        os.dup2(captured.fileno(), 2)
        try:
            return make()
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            captured.seek(0)
            lines = captured.read().decode("utf-8", "replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not any(m in line.lower() for m in MISSING_CUDA))
            if kept:
                os.write(2, kept.encode())


def raw_box(box: Tuple[int, int, int, int], raw_w: int, raw_h: int, orientation: int):
    """The box in the stored (unrotated) JPEG that EXIF ``orientation`` turns into ``box``."""
    x0, y0, x1, y1 = box
    if orientation in (5, 6, 7, 8):  # the oriented image is transposed: x runs along raw rows
        x0, y0, x1, y1 = y0, x0, y1, x1
    if orientation in (2, 3, 7, 8):  # raw columns run right to left
        x0, x1 = raw_w - x1, raw_w - x0
    if orientation in (3, 4, 6, 7):  # raw rows run bottom to top
        y0, y1 = raw_h - y1, raw_h - y0
    return x0, y0, x1, y1


def decode_box(data: bytes, box, raw_w: int, raw_h: int, orientation: int) -> Optional[np.ndarray]:
    """RGB pixels of ``box`` of the oriented image (not yet oriented: the caller orients), or None."""
    n, decoder, params = _codec()
    x0, y0, x1, y1 = raw_box(box, raw_w, raw_h, orientation)
    stream = n.CodeStream(data).get_sub_code_stream(region=n.Region(y0, x0, y1, x1))
    img = decoder.decode(stream, params=params)
    if img is None:
        count("full: nvimgcodec refused the stream")
        return None
    count("region")
    return np.asarray(img.cpu())
