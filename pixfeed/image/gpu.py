"""Decode and augment on the GPU (issue #37): ``BatchDecoder`` and ``crop_resize_batch``.

Same geometry on every device: the caller draws each sample's ``geometry.Plan`` on
the CPU from the header (``decode.oriented_size``, the record's seeded generator),
exactly as the CPU path does, and the device only renders it, so a sample shows
the same box and flip on any device and its pixels differ from the CPU path's
(``decode(..., exact=False)``) only within a tolerance (PSNR >= 35 dB, checked in
tests/test_gpu_path.py).

* ``BatchDecoder(device, backend)``: a batch of encoded records in one batched
  nvImageCodec ``decode`` call, straight into device memory.  JPEGs that
  ``jpeghead.probe`` accepts (YCbCr or grayscale; the EXIF orientation read as Pillow
  reads it) go to nvImageCodec; a random crop of an unrotated JPEG (orientation 1)
  decodes only its box (a sub code stream's ``Region``); other images are decoded whole,
  oriented, cropped on the device.  Each image is then resized by torch's antialiased
  bilinear filter (Pillow's, as the CPU path), cropped or padded, flipped.  PNGs,
  WebPs, CMYK/YCCK JPEGs and any image nvImageCodec refuses (a ``None``, an error)
  decode on the CPU (``decode(..., plan=plan, exact=False)``) inside the same batch
  and are copied to the device; ``stats()`` counts both, and the time spent.
* ``crop_resize_batch(images, plans, size)``: stored pixels (one size) cropped,
  resized and flipped in two batched matrix products: each sample's antialiased
  bilinear resampling is a (H x h) and a (W x w) weight matrix built from its plan
  (the box, the scale, the crop or pad offset and the flip all live in the weights),
  so the batch takes two ``matmul`` kernels whatever its plans.
* ``available(device)``: whether a GPU decoder runs on that device, and why not.

Backends: ``"auto"`` makes nvImageCodec's decoder with its default backends (the
hardware JPEG engine first where the GPU has one, then CUDA, hybrid and CPU:
11,248 full-size ImageNet JPEGs/s on an H200, against 10,827 for the hardware engine
alone), else the hardware engine with the hybrid decoder behind it, else the hybrid
one; ``"hw"``, ``"gpu"``, ``"hybrid"``, ``"default"`` ask for one; ``"cpu"`` is its CPU
backend into CPU tensors: the stand-in that runs all of this logic in CI.
"""
from __future__ import annotations

import os
import threading
import time
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from . import jpeghead
from .decode import CROP_RATIO, decode as cpu_decode, oriented_size
from .geometry import Plan, Size, plan as make_plan
from .pillow import check_limit, sniff
from . import pool as decodepool
from . import region as regiondecode

BACKENDS = ("auto", "default", "hw", "gpu", "hybrid", "cpu")
CPU_THREADS = max(1, min(4, (os.cpu_count() or 2) - 1))  # nvImageCodec's host threads (hybrid Huffman decoding,
# its CPU backend): within the loader's budget of 4 cores (issue #37), and one less than the machine's
_lock = threading.Lock()
_STATS = {"gpu_decoded": 0, "cpu_fallback": 0, "gpu_seconds": 0.0, "gpu_region": 0}
_available: dict = {}


def stats() -> dict:
    """This process's counts: images decoded by nvImageCodec (``gpu_decoded``, of which ``gpu_region``
    decoded only their box), images decoded on the CPU instead (``cpu_fallback``), and the seconds
    spent in ``BatchDecoder.decode`` (``gpu_seconds``: host time, the device's work enqueued)."""
    with _lock:
        return dict(_STATS)


def reset_stats() -> None:
    with _lock:
        _STATS.update(gpu_decoded=0, cpu_fallback=0, gpu_seconds=0.0, gpu_region=0)


def _count(**amounts) -> None:
    with _lock:
        for key, value in amounts.items():
            _STATS[key] += value


def _nvimgcodec():
    from nvidia import nvimgcodec
    return nvimgcodec


def _candidates(n, backend: str) -> List[Tuple[str, Optional[list]]]:
    """(name, backends list or None for nvImageCodec's defaults) to try, in order."""
    hw, hybrid = n.Backend(n.BackendKind.HW_GPU_ONLY), n.Backend(n.BackendKind.HYBRID_CPU_GPU)
    named = {"default": [("default backends", None)], "hw": [("hardware JPEG engine", [hw])],
             "gpu": [("CUDA", [n.Backend(n.BackendKind.GPU_ONLY)])], "hybrid": [("hybrid CPU+GPU", [hybrid])]}
    if backend == "auto":  # GPU_ONLY alone failed to be made under CUDA 13: not tried on its own
        return [*named["default"], ("hardware JPEG engine, hybrid behind it", [hw, hybrid]), *named["hybrid"]]
    return named[backend]


def _make_decoder(index: int, backend: str):
    """(nvimgcodec, decoder, what it is) for CUDA device ``index``; raises when none can be made."""
    n = _nvimgcodec()
    errors = []
    for name, backends in _candidates(n, backend):
        try:
            kwargs = {} if backends is None else {"backends": backends}
            decoder = regiondecode.quietly(lambda: n.Decoder(device_id=index, max_num_cpu_threads=CPU_THREADS,
                                                             **kwargs))
            return n, decoder, name
        except Exception as e:  # this nvImageCodec or GPU lacks it: try the next
            errors.append(f"{name}: {type(e).__name__}: {e}")
    raise RuntimeError("; ".join(errors) or "no backend")


def available(device) -> Tuple[bool, str]:
    """(whether a GPU decoder can run on ``device``, why or why not); made once per device."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        return False, f"{device!r} is not a device ({e})"
    if device.type != "cuda":
        return False, f"{device} is not a CUDA device"
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        return False, f"cuda:{index}: this machine has {torch.cuda.device_count()} CUDA device(s)"
    if index not in _available:
        if not regiondecode.available():
            _available[index] = False, "nvImageCodec is not installed (pip install 'pixfeed[gpu]')"
        else:
            try:
                _, _, name = _make_decoder(index, "auto")
                _available[index] = True, f"nvImageCodec ({name}) on cuda:{index}"
            except Exception as e:
                _available[index] = False, f"nvImageCodec made no GPU decoder on cuda:{index} ({e})"
    return _available[index]


class _Head:
    """What the GPU path needs from a JPEG header: stored size and EXIF orientation."""
    __slots__ = ("width", "height", "orientation")

    def __init__(self, width: int, height: int, orientation: int) -> None:
        self.width, self.height, self.orientation = width, height, orientation

    @property
    def oriented(self) -> Tuple[int, int]:
        """(W, H) after orientation."""
        return (self.height, self.width) if self.orientation in (5, 6, 7, 8) else (self.width, self.height)


def gpu_head(data) -> Optional[_Head]:
    """The header of a JPEG for nvImageCodec (YCbCr or grayscale, an orientation Pillow would read the
    same), else None (the CPU decodes it)."""
    if sniff(data) != "JPEG":
        return None
    if jpeghead.simplejpeg is not None:
        head = jpeghead.probe(data)
        return None if head is None else _Head(head.width, head.height, head.orientation)
    orientation = jpeghead.exif_orientation(data)  # without simplejpeg: Pillow reads the header
    if orientation is None:
        return None
    try:
        from PIL import Image
        import io
        img = Image.open(io.BytesIO(data), formats=["JPEG"])
        if img.mode not in ("RGB", "L"):
            return None
        return _Head(img.size[0], img.size[1], orientation if 1 <= orientation <= 8 else 1)
    except Exception:
        return None


def _orient(img: torch.Tensor, orientation: int) -> torch.Tensor:
    """An H x W x C image turned by EXIF ``orientation`` (as ``fast._ORIENT``, on any device)."""
    if orientation == 2:
        return img.flip(1)
    if orientation == 3:
        return img.flip(0, 1)
    if orientation == 4:
        return img.flip(0)
    if orientation == 5:
        return img.transpose(0, 1)
    if orientation == 6:
        return torch.rot90(img, -1, (0, 1))
    if orientation == 7:
        return img.flip(0, 1).transpose(0, 1)
    if orientation == 8:
        return torch.rot90(img, 1, (0, 1))
    return img


def render(img: torch.Tensor, p: Plan, size: Size) -> torch.Tensor:
    """An oriented H x W x 3 uint8 image (on any device) -> 3 x H x W uint8 by plan ``p``: crop the
    box, antialiased bilinear resize, crop or pad at the offset, flip."""
    H, W = size
    if p.box is not None:
        x0, y0, x1, y1 = p.box
        img = img[y0:y1, x0:x1]
    x = img.permute(2, 0, 1)
    (sw, sh), (ox, oy) = p.scaled, p.offset
    if tuple(x.shape[1:]) != (sh, sw):
        y = F.interpolate(x.unsqueeze(0).float(), size=(sh, sw), mode="bilinear", antialias=True,
                          align_corners=False)[0]
        x = y.round_().clamp_(0, 255).to(torch.uint8)
    if sw >= W and sh >= H:
        x = x[:, oy:oy + H, ox:ox + W]
    else:
        canvas = torch.zeros((3, H, W), dtype=torch.uint8, device=x.device)
        canvas[:, oy:oy + sh, ox:ox + sw] = x
        x = canvas
    return x.flip(2) if p.flip else x


def center_plan(w: int, h: int, size: Size) -> Plan:
    """The plan ``decode`` draws by default: Resize(floor(S / crop_ratio)) + CenterCrop(S)."""
    return make_plan(w, h, size, "crop", "center", None, CROP_RATIO)


class BatchDecoder:
    """Decodes batches of encoded records into ``device`` memory (see the module's docstring).

    ``decode(records, plans, size)``: uint8 N x 3 x H x W (channels_last) on the device, record ``j``
    rendered by ``plans[j]`` (None: every record by ``center_plan``; ``size`` None: whole images,
    which must then share one size).  ``region``: random crops of unrotated JPEGs decode only their box.
    ``cpu_threads``: threads for the records that fall back to the CPU decoder."""

    def __init__(self, device, backend: str = "auto", region: bool = True, cpu_threads: int = 1) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
        self.device = torch.device(device)
        self.backend, self.region, self.cpu_threads = backend, region, max(1, int(cpu_threads))
        if backend == "cpu":
            if self.device.type != "cpu":
                raise ValueError(f"backend='cpu' decodes into CPU tensors, not {self.device}")
            if not regiondecode.available():
                raise RuntimeError("nvImageCodec is not installed (pip install 'pixfeed[region]')")
        else:
            ok, why = available(self.device)
            if not ok:
                raise RuntimeError(f"no GPU decoder on {self.device}: {why}")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
        self.what = ""
        self._local = threading.local()

    def _codec(self):
        """(nvimgcodec, decoder, params) of this thread and process (a decoder is neither thread- nor fork-safe)."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            if self.backend == "cpu":
                def make():
                    n = _nvimgcodec()
                    return n, n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=CPU_THREADS,
                                        backends=[n.Backend(n.BackendKind.CPU_ONLY)]), "CPU backend (stand-in)"
                n, decoder, self.what = regiondecode.quietly(make)
            else:
                n, decoder, self.what = _make_decoder(self.device.index, self.backend)
            params = n.DecodeParams(color_spec=n.SRGB, sample_format=n.I_RGB, apply_exif_orientation=False)
            local.codec, local.pid = (n, decoder, params), os.getpid()
        return local.codec

    def decode(self, records: Sequence, plans: Optional[Sequence[Optional[Plan]]] = None,
               size: Optional[Size] = None) -> torch.Tensor:
        start = time.perf_counter()
        count = len(records)
        if plans is not None and len(plans) != count:
            raise ValueError(f"{count} records but {len(plans)} plans")
        if plans is not None and any(p is not None for p in plans) and size is None:
            raise ValueError("plans need size=, the output (H, W)")
        heads = [gpu_head(r) for r in records]
        plans = list(plans) if plans is not None else [None] * count
        if size is not None:
            for j, (head, p) in enumerate(zip(heads, plans)):
                if p is None:
                    w, h = head.oriented if head is not None else oriented_size(records[j], f"record {j}")
                    plans[j] = center_plan(w, h, size)
        for j, head in enumerate(heads):
            if head is not None:
                check_limit(head.width, head.height, f"record {j}")
        images = self._gpu_images(records, heads, plans)
        fallback = [j for j in range(count) if images[j] is None]
        outputs: List[Optional[torch.Tensor]] = [None] * count
        for j, img in enumerate(images):
            if img is not None:
                outputs[j] = render(img, plans[j], size) if size is not None else img.permute(2, 0, 1)

        def on_cpu(j: int) -> None:
            arr = cpu_decode(bytes(records[j]), size=size, plan=plans[j], where=f"record {j}", exact=False)
            outputs[j] = torch.from_numpy(np.array(arr)).permute(2, 0, 1)
        decodepool.run(lambda k: on_cpu(fallback[k]), len(fallback), self.cpu_threads)
        out = self._stack(outputs)
        _count(cpu_fallback=len(fallback), gpu_decoded=count - len(fallback),
               gpu_seconds=time.perf_counter() - start)
        return out

    def _stack(self, outputs: List[torch.Tensor]) -> torch.Tensor:
        shapes = {tuple(o.shape) for o in outputs}
        if len(shapes) > 1:
            raise ValueError(f"images of different sizes {sorted(shapes)} cannot share a batch: pass size=")
        shape = next(iter(shapes)) if shapes else (3, 0, 0)
        out = torch.empty((len(outputs), *shape), dtype=torch.uint8, device=self.device,
                          memory_format=torch.channels_last)
        for j, o in enumerate(outputs):
            out[j].copy_(o, non_blocking=True)  # a CPU fallback's pixels: pageable, so the copy is synchronous
        return out

    def _gpu_images(self, records, heads, plans) -> List[Optional[torch.Tensor]]:
        """Oriented H x W x 3 uint8 tensors on the device (a region decode: the box alone, its plan's box
        made the whole of it), None where the CPU decodes."""
        images: List[Optional[torch.Tensor]] = [None] * len(records)
        todo = [j for j, h in enumerate(heads) if h is not None]
        if not todo:
            return images
        n, decoder, params = self._codec()
        regions = {}
        streams = []
        for j in todo:
            head, p = heads[j], plans[j]
            stream = n.CodeStream(bytes(records[j]) if not isinstance(records[j], bytes) else records[j])
            if self.region and p is not None and p.box is not None and head.orientation in (0, 1) and \
                    tuple(p.box) != (0, 0, head.width, head.height):
                x0, y0, x1, y1 = p.box
                regions[j] = stream
                stream = stream.get_sub_code_stream(region=n.Region(y0, x0, y1, x1))
            streams.append(stream)
        decoded = self._run(decoder, streams, params)
        retry = []
        for j, img in zip(todo, decoded):
            tensor = self._tensor(img)
            head, p = heads[j], plans[j]
            if tensor is None:
                if j in regions:
                    retry.append(j)
                continue
            if j in regions:
                x0, y0, x1, y1 = p.box
                if tuple(tensor.shape[:2]) == (y1 - y0, x1 - x0):
                    images[j] = tensor
                    plans[j] = p._replace(box=None)
                    _count(gpu_region=1)
                elif tuple(tensor.shape[:2]) == (head.height, head.width):  # the whole image after all
                    images[j] = tensor
                else:
                    retry.append(j)
                continue
            if tuple(tensor.shape[:2]) == (head.height, head.width):
                images[j] = _orient(tensor, head.orientation)
        if retry:  # region decodes refused: the whole image, still on the device
            for j, img in zip(retry, self._run(decoder, [regions[j] for j in retry], params)):
                tensor = self._tensor(img)
                if tensor is not None and tuple(tensor.shape[:2]) == (heads[j].height, heads[j].width):
                    images[j] = tensor
        return images

    def _run(self, decoder, streams, params) -> list:
        kwargs = {}
        if self.device.type == "cuda":
            kwargs["cuda_stream"] = torch.cuda.current_stream(self.device).cuda_stream
        try:
            return list(decoder.decode(streams, params=params, **kwargs))
        except Exception:  # one image broke the batch call: each alone, so only that one goes to the CPU
            out = []
            for stream in streams:
                try:
                    out.append(decoder.decode(stream, params=params, **kwargs))
                except Exception:
                    out.append(None)
            return out

    def _tensor(self, img) -> Optional[torch.Tensor]:
        """An nvImageCodec image as an H x W x 3 uint8 tensor on the device, None if it is not one."""
        if img is None:
            return None
        try:
            if self.device.type == "cpu":
                tensor = torch.from_numpy(np.asarray(img.cpu()))
            else:
                try:
                    tensor = torch.from_dlpack(img)
                except Exception:
                    tensor = torch.as_tensor(img, device=self.device)
        except Exception:
            return None
        if tensor.dim() == 2:
            tensor = tensor.unsqueeze(2)
        if tensor.dim() != 3 or tensor.dtype != torch.uint8:
            return None
        if tensor.shape[2] == 1:
            tensor = tensor.expand(-1, -1, 3)
        return tensor if tensor.shape[2] == 3 else None


def resample_weights(plans: Sequence[Plan], size: Size, src: Tuple[int, int], axis: int,
                     device=None) -> torch.Tensor:
    """N x out x in float32 weights of each plan's antialiased bilinear resampling along one axis
    (``axis`` 0: rows, 1: columns) of ``src`` (w, h) images: Pillow's triangle filter, widened by the
    scale when shrinking, over the box's pixels only (crop, then resize); rows of the output outside a
    pad's image are zero; a flip reverses the columns' rows."""
    out_len, in_len = size[0] if axis == 0 else size[1], src[1] if axis == 0 else src[0]
    k = 1 - axis  # index into (x, y) pairs: columns use x (0), rows use y (1)
    b0, b1, scaled, offset, flips = [], [], [], [], []
    for p in plans:
        box = p.box if p.box is not None else (0, 0, *src)
        b0.append(box[k])
        b1.append(box[k + 2])
        scaled.append(p.scaled[k])
        offset.append(p.offset[k])
        flips.append(bool(p.flip) and axis == 1)
    t = lambda v: torch.tensor(v, dtype=torch.float64, device=device)[:, None, None]  # noqa: E731
    b0, b1, scaled, offset = t(b0), t(b1), t(scaled), t(offset)
    j = torch.arange(out_len, dtype=torch.float64, device=device)[None, :, None]
    col = torch.where(scaled >= out_len, j + offset, j - offset)  # crop: the kept window's; pad: the image's
    scale = (b1 - b0) / scaled
    support = torch.clamp(scale, min=1.0)
    centre = b0 + (col + 0.5) * scale
    i = torch.arange(in_len, dtype=torch.float64, device=device)[None, None, :] + 0.5
    w = torch.clamp(1 - (i - centre).abs() / support, min=0)
    w = w * ((i > b0) & (i < b1))  # only the box's pixels
    w = w * ((col >= 0) & (col < scaled))  # a pad's border is black
    total = w.sum(2, keepdim=True)
    w = torch.where(total > 0, w / torch.where(total > 0, total, torch.ones_like(total)), w)
    flip = torch.tensor(flips, device=device)[:, None, None]
    w = torch.where(flip, w.flip(1), w)
    return w.float()


def crop_resize_batch(images: torch.Tensor, plans: Sequence[Plan], size: Size) -> torch.Tensor:
    """uint8 N x 3 x h x w (one size, any device) -> uint8 N x 3 x H x W (channels_last), sample ``j``
    rendered by ``plans[j]`` (box, antialiased bilinear resize, crop or pad, flip) in two batched
    matrix products on the images' device."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected N x 3 x h x w images, got {tuple(images.shape)}")
    if len(plans) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(plans)} plans")
    H, W = size
    n, _, h, w = images.shape
    if n == 0:
        return torch.empty((0, 3, H, W), dtype=torch.uint8, device=images.device, memory_format=torch.channels_last)
    rows = resample_weights(plans, size, (w, h), 0, images.device)  # N x H x h
    cols = resample_weights(plans, size, (w, h), 1, images.device)  # N x W x w
    with torch.autocast(images.device.type, enabled=False):  # a caller's bf16/fp16 autocast: still float32
        x = images.float()
        x = torch.matmul(x, cols.transpose(1, 2).unsqueeze(1))  # N x 3 x h x W
        x = torch.matmul(rows.unsqueeze(1), x)  # N x 3 x H x W
    out = torch.empty((n, 3, H, W), dtype=torch.uint8, device=images.device, memory_format=torch.channels_last)
    out.copy_(x.round_().clamp_(0, 255))
    return out
