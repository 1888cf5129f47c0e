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
Its libjpeg-turbo prints its warnings on a damaged stream ("Corrupt JPEG data:
premature end of data segment") straight to the process's stderr, where no
Python code sees them: ``decoder_output`` points file descriptor 2 at a pipe
while any thread decodes a box (counted: the decodes still run in parallel);
a reader thread sends the decoders' lines to the ``pixfeed.image`` log (level
INFO) and every other line on to the real stderr.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import select
import sys
import tempfile
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Optional, Tuple

import numpy as np

log = logging.getLogger("pixfeed.image")

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
    missing CUDA libraries is written to stderr after it.  Under ``_fd_lock``: no box decode's
    redirection of stderr starts or ends meanwhile."""
    with _fd_lock:
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
                _write_lines(2, kept.encode())


# the start of libjpeg-turbo's warnings (jerror.h's JWRN_* texts) and of nvimgcodec's own tagged lines (their
# colour codes taken out)
DECODER_LINE = re.compile(r"(Corrupt JPEG data|Premature end of JPEG|Warning: |Inconsistent progression|"
                          r"Invalid SOS parameters|Unknown Adobe color transform|Application transferred too few)"
                          r"|\[(ERROR|WARNING|INFO)\] *\[(pynvimgcodec|jpeg_parser|libjpeg|nvjpeg|nvimgcodec)")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_fd_lock = threading.Lock()
# stderr's redirection in this process: how many threads are decoding, the real stderr (a copy of file
# descriptor 2), the pipe it is pointed at meanwhile, and the records being decoded (named in the log)
_fd: dict = {"depth": 0, "real": None, "pipe": None, "where": {}, "reader": None}


@contextmanager
def decoder_output(where: str):
    """While any thread is inside, file descriptor 2 is a pipe, read by one thread of this process
    (``_pass_on``) that sends decoders' lines (``DECODER_LINE``) to the log, naming the record being
    decoded, nvimgcodec's notes on missing CUDA libraries nowhere, and every other line on to the real
    stderr as it comes (a pipe: a line written meanwhile by anyone is neither lost nor cut)."""
    me = threading.get_ident()
    with _fd_lock:
        if _fd["pipe"] is None:
            _fd["real"], _fd["pipe"] = os.dup(2), os.pipe()
            _fd["reader"] = threading.Thread(target=_pass_on, args=(_fd["pipe"][0], _fd["real"]), daemon=True,
                                             name="pixfeed-decoder-output")
            _fd["reader"].start()
        if _fd["depth"] == 0:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(_fd["pipe"][1], 2)
        _fd["depth"] += 1
        _fd["where"][me] = where
    try:
        yield
    finally:
        with _fd_lock:
            _fd["depth"] -= 1
            if _fd["depth"] == 0:
                if sys.stderr is not None:
                    sys.stderr.flush()
                os.dup2(_fd["real"], 2)


def _pass_on(read: int, real: int) -> None:
    """Sort what reaches the pipe, line by line (a line left unfinished for 50 ms goes on as it is)."""
    carry = b""
    while True:
        if not select.select([read], [], [], 0.05 if carry else None)[0]:
            chunk, cut = b"", len(carry)  # nothing more came: pass the unfinished line on
        else:
            chunk = os.read(read, 65536)
            if not chunk:
                return
            carry += chunk
            cut = max(carry.rfind(b"\n"), carry.rfind(b"\r")) + 1
        done, carry = carry[:cut], carry[cut:]
        try:
            done = _sorted(done)
        finally:  # whatever goes wrong in sorting, the reader lives on (a full pipe would block writers)
            _write_lines(real, done)


def _write_lines(fd: int, data: bytes) -> None:
    """Write whole lines in writes of at most PIPE_BUF bytes, each atomic on a pipe: none is cut by
    another thread's write to the real stderr."""
    batch = b""
    for line in data.splitlines(keepends=True):
        if batch and len(batch) + len(line) > select.PIPE_BUF:
            os.write(fd, batch)
            batch = b""
        batch += line
    if batch:
        os.write(fd, batch)


def _sorted(done: bytes) -> bytes:
    """The lines of ``done`` that go on to stderr; decoders' lines logged."""
    passed = []
    for line in done.decode("utf-8", "replace").splitlines(keepends=True):
        if any(m in line.lower() for m in MISSING_CUDA):
            continue
        if DECODER_LINE.match(_COLOUR.sub("", line)):  # at the start: a Python "UserWarning: " line goes on
            where = ", ".join(sorted({str(w) for w in list(_fd["where"].values())})) or "<bytes>"
            log.info("while decoding %s: %s", where, _COLOUR.sub("", line).strip())
        else:
            passed.append(line)
    return "".join(passed).encode()


def _drain_at_exit() -> None:
    """At interpreter exit: stderr put back, the pipe closed, what is still in it passed on."""
    with _fd_lock:
        if _fd["pipe"] is None:
            return
        if _fd["depth"]:
            os.dup2(_fd["real"], 2)
        os.close(_fd["pipe"][1])  # the reader sees the end once it has read the rest
        reader, _fd["pipe"] = _fd["reader"], None
    reader.join(2)


atexit.register(_drain_at_exit)


def _forget_redirection() -> None:
    """In a forked child: stderr as it was, no thread inside and no reader (they did not come along)."""
    global _fd_lock
    _fd_lock = threading.Lock()
    if _fd["pipe"] is not None:
        if _fd["depth"]:
            os.dup2(_fd["real"], 2)
        for fd in (*_fd["pipe"], _fd["real"]):
            os.close(fd)
    _fd.update(depth=0, real=None, pipe=None, where={}, reader=None)


os.register_at_fork(after_in_child=_forget_redirection)


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


def decode_box(data: bytes, box, raw_w: int, raw_h: int, orientation: int,
               where: str = "<bytes>") -> Optional[np.ndarray]:
    """RGB pixels of ``box`` of the oriented image (not yet oriented: the caller orients), or None."""
    n, decoder, params = _codec()
    x0, y0, x1, y1 = raw_box(box, raw_w, raw_h, orientation)
    stream = n.CodeStream(data).get_sub_code_stream(region=n.Region(y0, x0, y1, x1))
    with decoder_output(where):
        img = decoder.decode(stream, params=params)
    if img is None:
        count("full: nvimgcodec refused the stream")
        return None
    count("region")
    return np.asarray(img.cpu())
