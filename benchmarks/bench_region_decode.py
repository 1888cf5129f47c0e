"""Region decode (only the rows and columns a crop keeps) against today's full decode, same images, same boxes.

    python benchmarks/bench_region_decode.py IMAGES [--reps 7] [--limit 200]

One core, each candidate through all images in a row, candidates taking turns
``--reps`` times (``bench_decode.interleaved``); ms per image and the ratio to
``simplejpeg full``, today's fast-path decode step (simplejpeg, fast IDCT, plain
chroma upsampling, DCT scaling 1/d as ``_fastdecode.dct_divisor`` picks it),
and what the whole fast path (decode + crop + resize, measured in the same
run) would gain if a candidate replaced that step.
Boxes: RandomResizedCrop to 224 (``pixfeed.image.geometry``, seed 0) and the
evaluation center crop (Resize(256) + CenterCrop(224)), in source pixels.
With the ``region`` extra installed, the whole fast path is also measured with
and without it (``pixfeed.image.region``).  Candidates missing here are skipped
with a note:

* ``nvimgcodec region``: nvidia-nvimgcodec-cu12's CPU backend, region decode by
  libjpeg-turbo (accurate IDCT, no DCT scaling: its API has none).
* ``turbojpeg crop+decode``: PyTurboJPEG 1.x on the system libturbojpeg 2.x,
  whose API has no region decode: a lossless crop to the iMCU grid, then decode.
* ``libjpeg region`` / ``libjpeg full``: a C shim (``jpeg_crop_scanline`` +
  ``jpeg_skip_scanlines``, the flags and scale of simplejpeg above) over the
  libjpeg-turbo in Pillow's wheel (else the system one), compiled here when
  ``cc`` and ``jpeglib.h`` exist: the ceiling of region decode itself, also as a
  ratio to a full decode by the same library.  (Python alone cannot drive
  libjpeg safely: its error handler must longjmp out of the library.)
"""
from __future__ import annotations

import argparse
import ctypes
import math
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional

import numpy as np
import PIL
import simplejpeg
import torch

from bench_decode import interleaved
from pixfeed.image import jpeghead as _jpeghead, region as _regiondecode, geometry
from pixfeed.image.fast import dct_divisor
from pixfeed.image.decode import decode
from pixfeed.sources.folder import scan

SHIM = r"""
#include <stdio.h>
#include <setjmp.h>
#include <jpeglib.h>
struct err { struct jpeg_error_mgr pub; jmp_buf jb; };
static void on_error(j_common_ptr c) { longjmp(((struct err *)c->err)->jb, 1); }
static void on_message(j_common_ptr c, int level) { (void)c; (void)level; }
/* rows [y0, y1) of columns from x0 to x1 (widened to the iMCU grid) at 1/denom scale into out;
   returns the first column decoded, or -1 on a libjpeg error */
int region(const unsigned char *data, unsigned long n, int x0, int y0, int x1, int y1, int denom,
           unsigned char *out, int stride) {
    struct jpeg_decompress_struct ci; struct err e;
    ci.err = jpeg_std_error(&e.pub); e.pub.error_exit = on_error; e.pub.emit_message = on_message;
    if (setjmp(e.jb)) { jpeg_destroy_decompress(&ci); return -1; }
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, data, n);
    jpeg_read_header(&ci, TRUE);
    ci.out_color_space = JCS_RGB; ci.scale_num = 1; ci.scale_denom = denom;
    ci.dct_method = JDCT_IFAST; ci.do_fancy_upsampling = FALSE;
    jpeg_start_decompress(&ci);
    JDIMENSION xo = x0, w = x1 - x0;
    if (x0 > 0 || x1 < (int)ci.output_width) jpeg_crop_scanline(&ci, &xo, &w);
    if (y0 > 0) jpeg_skip_scanlines(&ci, y0);
    while ((int)ci.output_scanline < y1) {
        JSAMPROW row = out + (size_t)(ci.output_scanline - y0) * stride;
        jpeg_read_scanlines(&ci, &row, 1);
    }
    jpeg_abort_decompress(&ci); jpeg_destroy_decompress(&ci);
    return (int)xo;
}
"""


def center_box(w: int, h: int, size: int = 224) -> tuple:
    """The source pixels under the Resize(256) + CenterCrop(224) window (plus one for the filter)."""
    p = geometry.plan(w, h, (size, size), crop_ratio=224 / 256)
    sx, sy = w / p.scaled[0], h / p.scaled[1]
    (ox, oy) = p.offset
    return (max(0, math.floor(ox * sx) - 1), max(0, math.floor(oy * sy) - 1),
            min(w, math.ceil((ox + size) * sx) + 1), min(h, math.ceil((oy + size) * sy) + 1))


def items(blobs, kind: str, size: int = 224):
    """(bytes, box in source pixels, w, h, DCT divisor) for every image."""
    rng = np.random.default_rng(0)
    out = []
    for b in blobs:
        h, w = simplejpeg.decode_jpeg_header(b)[:2]
        if kind == "rrc":
            p = geometry.plan(w, h, (size, size), crop="random", rng=rng)
            box = p.box
        else:
            box = center_box(w, h, size)
            p = geometry.Plan(box, (box[2] - box[0], box[3] - box[1]), (size, size), (0, 0))
        out.append((b, box, w, h, dct_divisor(p)))
    return out


def pixfeed_fast(kind: str, region: bool) -> Callable:
    """The whole fast path (decode + crop + resize to 224), with or without the region decode extra."""
    rng = np.random.default_rng(0)
    crop = "random" if kind == "rrc" else "center"

    def run(it):
        _regiondecode.ENABLED = region
        return decode(it[0], size=(224, 224), crop=crop, rng=rng)
    return run


def simplejpeg_full(it):
    b, _, w, h, d = it
    return simplejpeg.decode_jpeg(b, "RGB", fastdct=True, fastupsample=True, min_height=-(-h // d),
                                  min_width=-(-w // d))


def shim_candidates() -> Dict[str, Callable]:
    bundled = sorted((Path(PIL.__file__).parents[1] / "pillow.libs").glob("libjpeg*.so*"))
    link = [str(bundled[0]), f"-Wl,-rpath,{bundled[0].parent}"] if bundled else ["-ljpeg"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "region.c").write_text(SHIM)
        try:
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", f"{tmp}/region.so", f"{tmp}/region.c", *link],
                           check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"  (libjpeg shim skipped: cannot compile against jpeglib.h: {getattr(e, 'stderr', e)!r:.200})")
            return {}
        lib = ctypes.CDLL(f"{tmp}/region.so")
    I = ctypes.c_int
    lib.region.argtypes = [ctypes.c_char_p, ctypes.c_ulong, I, I, I, I, I, ctypes.c_void_p, I]

    def run(it, whole: bool = False):
        """(rows y0:y1 of the decode at 1/d, from column xo on; xo)."""
        b, box, w, h, d = it
        x0, y0, x1, y1 = (0, 0, w, h) if whole else box
        x0, y0, x1, y1 = x0 // d, y0 // d, -(-x1 // d), -(-y1 // d)
        out = np.empty((y1 - y0, -(-w // d), 3), np.uint8)
        xo = lib.region(b, len(b), x0, y0, x1, y1, d, out.ctypes.data, out.strides[0])
        if xo < 0:
            raise ValueError("libjpeg error")
        return out[:, : x1 - xo], xo
    return {"libjpeg full": lambda it: run(it, whole=True), "libjpeg region": run}


def region_is_exact(cands: Dict[str, Callable], data) -> bool:
    """The shim's region equals the same rows and columns of its full decode (so it measures a real decode)."""
    for it in data[:20]:
        (region, xo), (full, _) = cands["libjpeg region"](it), cands["libjpeg full"](it)
        y0 = it[1][1] // it[4]
        if not np.array_equal(region, full[y0:y0 + len(region), xo:xo + region.shape[1]]):
            return False
    return True


def nvimgcodec_candidate() -> Optional[Callable]:
    try:
        from nvidia import nvimgcodec as n
    except ImportError:
        print("  (nvimgcodec region skipped: pip install nvidia-nvimgcodec-cu12)")
        return None
    dec = n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY, backends=[n.Backend(n.BackendKind.CPU_ONLY)])
    params = n.DecodeParams(color_spec=n.SRGB, sample_format=n.I_RGB, apply_exif_orientation=False)

    def run(it):
        x0, y0, x1, y1 = it[1]
        stream = n.CodeStream(it[0]).get_sub_code_stream(region=n.Region(y0, x0, y1, x1))
        return np.asarray(dec.decode(stream, params=params).cpu())
    return run


def turbojpeg_candidate() -> Optional[Callable]:
    try:
        from turbojpeg import TJFLAG_FASTDCT, TJFLAG_FASTUPSAMPLE, TJPF_RGB, TurboJPEG
        tj = TurboJPEG()
    except (ImportError, RuntimeError, OSError) as e:
        print(f"  (turbojpeg crop+decode skipped: {e})")
        return None

    def run(it):
        x0, y0, x1, y1 = it[1]
        return tj.decode(tj.crop(it[0], x0, y0, x1 - x0, y1 - y0, preserve=True), TJPF_RGB,
                         flags=TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--limit", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    source = scan(args.src)
    blobs = [(source.root / p).read_bytes() for p in source.paths[: args.limit]]
    blobs = [b for b in blobs if _jpeghead.probe(b) is not None]  # the JPEGs today's fast path gives simplejpeg
    cands = {"simplejpeg full": simplejpeg_full, **shim_candidates()}
    for name, cand in [("nvimgcodec region", nvimgcodec_candidate()), ("turbojpeg crop+decode", turbojpeg_candidate())]:
        if cand is not None:
            cands[name] = cand
    for kind in ("rrc", "center"):
        data = items(blobs, kind)
        area = np.mean([(x1 - x0) * (y1 - y0) / (w * h) for _, (x0, y0, x1, y1), w, h, _ in data])
        paths = {"pixfeed fast path": pixfeed_fast(kind, False)}
        if _regiondecode.available():
            paths["pixfeed fast path + region"] = pixfeed_fast(kind, True)
        runs = {**cands, **paths}
        times = interleaved(runs, {k: data for k in runs}, args.reps)
        total, full = times["pixfeed fast path"], times["simplejpeg full"]
        print(f"\n{kind}: {len(data)} JPEGs, box {area:.0%} of the image on average, one thread, best of "
              f"{args.reps}; today's fast path (decode, crop, resize) {total * 1e3:.2f} ms, decode {full / total:.0%}")
        head = "end to end if it replaced the decode step"
        print(f"  {'candidate':24s} {'decode':>9s}  {'x today':>7s}  {head:>42s}")
        for k in cands:
            t = times[k]
            print(f"  {k:24s} {t * 1e3:6.2f} ms  {full / t:6.2f}x  {total / (total - full + t):41.2f}x")
        if "pixfeed fast path + region" in times:
            t = times["pixfeed fast path + region"]
            print(f"  measured: pixfeed[region] fast path {t * 1e3:.2f} ms, {total / t:.2f}x today's fast path")
        if "libjpeg full" in times:
            print(f"  region decode alone: {times['libjpeg full'] / times['libjpeg region']:.2f}x a full decode "
                  f"by the same libjpeg-turbo; its pixels equal the full decode's: {region_is_exact(cands, data)}")


if __name__ == "__main__":
    main()
