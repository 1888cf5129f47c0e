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

import math
import os
import threading
import time
from contextlib import nullcontext
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from . import jpeghead
from .decode import CROP_RATIO, decode as cpu_decode, oriented_size
from . import geometry
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
    gpu_only = [("hardware JPEG engine, hybrid behind it", [hw, hybrid]), *named["hybrid"]]
    if backend == "auto":  # GPU_ONLY alone failed to be made under CUDA 13: not tried on its own
        return [*named["default"], *gpu_only]
    if backend == "gpu-only":  # no CPU backend behind: what available() tries
        return gpu_only
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
                _available[index] = True, _decodes_on_gpu(index)
            except Exception as e:
                _available[index] = False, f"nvImageCodec made no GPU decoder on cuda:{index} ({e})"
    return _available[index]


def _decodes_on_gpu(index: int) -> str:
    """What decoded a small JPEG on CUDA device ``index`` with nvImageCodec's GPU backends alone (no CPU
    backend behind them, which would answer for a missing nvJPEG); raises with the reason when none did."""
    import io
    from PIL import Image

    n, decoder, name = _make_decoder(index, "gpu-only")
    probe = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 90)).save(probe, "JPEG", quality=90)
    params = n.DecodeParams(color_spec=n.SRGB, sample_format=n.I_RGB, apply_exif_orientation=False)
    with torch.cuda.device(index):
        stream = torch.cuda.current_stream(index)
        image = decoder.decode(n.CodeStream(probe.getvalue()), params=params, cuda_stream=stream.cuda_stream)
        stream.synchronize()  # once, when the plan is made
    if image is None or tuple(image.shape[:2]) != (48, 64):
        raise RuntimeError(f"its {name} decoded no JPEG: nvJPEG is missing or not built for this CUDA "
                           "(pip install 'pixfeed[gpu]' for CUDA 12, 'pixfeed[gpu-cu13]' for CUDA 13)")
    return f"nvImageCodec ({name}) on cuda:{index}"


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

    ``decode(records, plans, size, heads)``: uint8 N x 3 x H x W (channels_last) on the device, record ``j``
    rendered by ``plans[j]`` (a ``geometry.Plans`` or a sequence of ``Plan``; None: every record by
    ``center_plan``; ``size`` None: whole images, which must then share one size).  ``records``: bytes,
    memoryviews or uint8 arrays, handed to nvImageCodec without a copy.  ``heads``: each record's
    ``gpu_head`` when the caller parsed it already (None where the CPU decodes).  ``region``: random crops
    of unrotated JPEGs decode only their box.  ``cpu_threads``: threads for the records that fall back to
    the CPU decoder.  One nvImageCodec decoder serves every thread (one at a time), made on first use."""

    PAD_SIDE = 768  # decoded images up to this side are resized together; a larger one alone (rare)

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
        self._codec_of: Optional[tuple] = None  # (pid, (nvimgcodec, decoder, params))
        self._lock = threading.Lock()
        self.staging = Staging(self.device)

    def prepare(self) -> "BatchDecoder":
        """Make the nvImageCodec decoder now, in this thread (the loader's: making one silences the library's
        notes by redirecting the process's stdout and stderr a moment, which a reader thread must not do)."""
        with self._lock:
            self._codec()
        return self

    def _codec(self):
        """(nvimgcodec, decoder, params) of this process (a decoder is not fork-safe; ``_lock`` held)."""
        if self._codec_of is None or self._codec_of[0] != os.getpid():
            if self.backend == "cpu":
                def make():
                    n = _nvimgcodec()
                    return n, n.Decoder(device_id=n.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=CPU_THREADS,
                                        backends=[n.Backend(n.BackendKind.CPU_ONLY)]), "CPU backend (stand-in)"
                n, decoder, self.what = regiondecode.quietly(make)
            else:
                n, decoder, self.what = _make_decoder(self.device.index, self.backend)
            params = n.DecodeParams(color_spec=n.SRGB, sample_format=n.I_RGB, apply_exif_orientation=False)
            self._codec_of = os.getpid(), (n, decoder, params)
        return self._codec_of[1]

    def decode(self, records: Sequence, plans=None, size: Optional[Size] = None,
               heads: Optional[Sequence] = None) -> torch.Tensor:
        start = time.perf_counter()
        count = len(records)
        if plans is not None and len(plans) != count:
            raise ValueError(f"{count} records but {len(plans)} plans")
        if plans is not None and size is None:
            raise ValueError("plans need size=, the output (H, W)")
        heads = [gpu_head(r) for r in records] if heads is None else list(heads)
        for j, head in enumerate(heads):
            if head is not None:
                check_limit(head.width, head.height, f"record {j}")
        if size is not None:
            plans = self._plans(records, heads, plans, size)
        with self._lock, (torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext()):
            images, boxes = self._gpu_images(records, heads, plans)
            out = self._render(images, plans, boxes, size) if size is not None else None
        fallback = [j for j in range(count) if images[j] is None]
        outputs: List[Optional[torch.Tensor]] = [None] * count if size is None else []
        if size is None:
            for j, img in enumerate(images):
                if img is not None:
                    outputs[j] = img.permute(2, 0, 1)

        def on_cpu(j: int) -> None:
            arr = cpu_decode(bytes(records[j]), size=size, plan=plans[j] if plans is not None else None,
                             where=f"record {j}", exact=False)
            tensor = torch.from_numpy(np.array(arr)).permute(2, 0, 1)
            if size is None:
                outputs[j] = tensor
            else:
                out[j].copy_(tensor)  # pageable pixels: a synchronous copy, for the rare fallback only
        decodepool.run(lambda k: on_cpu(fallback[k]), len(fallback), self.cpu_threads)
        if size is None:
            out = self._stack(outputs)
        _count(cpu_fallback=len(fallback), gpu_decoded=count - len(fallback),
               gpu_seconds=time.perf_counter() - start)
        return out

    @staticmethod
    def _plans(records, heads, plans, size: Size) -> geometry.Plans:
        """The batch's ``Plans``: the caller's, with ``center_plan`` where it gave None (or gave none)."""
        if isinstance(plans, geometry.Plans):
            return plans
        if plans is None or any(p is None for p in plans):
            sizes = np.array([head.oriented if head is not None else oriented_size(records[j], f"record {j}")
                              for j, head in enumerate(heads)], np.int64).reshape(-1, 2)
            center = geometry.plans(sizes[:, 0], sizes[:, 1], size, "center", crop_ratio=CROP_RATIO)
            if plans is None:
                return center
            plans = [center[j] if p is None else p for j, p in enumerate(plans)]
        return geometry.Plans.of(plans)

    def _render(self, images: List[Optional[torch.Tensor]], plans: geometry.Plans, boxes: np.ndarray,
                size: Size) -> torch.Tensor:
        """The decoded images (each ``boxes[j]`` of it rendered by ``plans[j]``) as N x 3 x H x W uint8: those
        up to ``PAD_SIDE`` laid top-left in one padded batch and resized in a few batched kernels, each
        larger one alone; rows of images the CPU decodes are left for it."""
        H, W = size
        count = len(images)
        shapes = [None if img is None else tuple(img.shape[:2]) for img in images]
        together = [j for j, hw in enumerate(shapes) if hw is not None and max(hw) <= self.PAD_SIDE]
        out = None if together and len(together) == count else \
            torch.empty((count, 3, H, W), dtype=torch.uint8, device=self.device, memory_format=torch.channels_last)
        if together:
            hp, wp = max(shapes[j][0] for j in together), max(shapes[j][1] for j in together)
            padded = torch.empty((len(together), hp, wp, 3), dtype=torch.uint8, device=self.device)
            for k, j in enumerate(together):
                padded[k, :shapes[j][0], :shapes[j][1]] = images[j]
            sel = np.asarray(together)
            sub = geometry.Plans(boxes[sel], plans.src[sel], plans.scaled[sel], plans.offset[sel], plans.flip[sel],
                                 plans.random)
            sent = self.staging.send([plan_array(sub)] + ([sel.astype(np.int64)] if len(together) < count else []))
            rendered = crop_resize_batch(padded.permute(0, 3, 1, 2), sub, size, sent[0])
            if out is None:
                return rendered
            out.index_copy_(0, sent[1], rendered)
        for j, img in enumerate(images):
            if img is not None and max(shapes[j]) > self.PAD_SIDE:
                out[j].copy_(render(img, plans[j]._replace(box=tuple(boxes[j].tolist())), size))
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

    def _gpu_images(self, records, heads, plans) -> Tuple[List[Optional[torch.Tensor]], Optional[np.ndarray]]:
        """(oriented H x W x 3 uint8 tensors on the device, None where the CPU decodes; each plan's box within
        its tensor: a region decode's tensor is the box alone)."""
        images: List[Optional[torch.Tensor]] = [None] * len(records)
        boxes = plans.box.tolist() if plans is not None else None  # Python lists: per-image work stays cheap
        todo = [j for j, h in enumerate(heads) if h is not None]
        if not todo:
            return images, None if boxes is None else np.array(boxes, np.int64).reshape(-1, 4)
        n, decoder, params = self._codec()
        regions = {}
        streams = []
        cropped = self.region and plans is not None and plans.random
        for j in todo:
            head = heads[j]
            record = records[j]  # bytes, or a view handed over as an array: not copied
            stream = n.CodeStream(record if isinstance(record, (bytes, np.ndarray)) else
                                  np.frombuffer(record, np.uint8))
            if cropped and head.orientation in (0, 1) and boxes[j] != [0, 0, head.width, head.height]:
                x0, y0, x1, y1 = boxes[j]
                regions[j] = stream
                stream = stream.get_sub_code_stream(region=n.Region(y0, x0, y1, x1))
            streams.append(stream)
        decoded = self._run(decoder, streams, params)
        retry = []
        for j, img in zip(todo, decoded):
            tensor = self._tensor(img)
            head = heads[j]
            if tensor is None:
                if j in regions:
                    retry.append(j)
                continue
            shape = tuple(tensor.shape[:2])
            if j in regions:
                x0, y0, x1, y1 = boxes[j]
                if shape == (y1 - y0, x1 - x0):
                    images[j] = tensor
                    boxes[j] = [0, 0, x1 - x0, y1 - y0]
                    _count(gpu_region=1)
                elif shape == (head.height, head.width):  # the whole image after all
                    images[j] = tensor
                else:
                    retry.append(j)
                continue
            if shape == (head.height, head.width):
                images[j] = _orient(tensor, head.orientation)
        if retry:  # region decodes refused: the whole image, still on the device
            for j, img in zip(retry, self._run(decoder, [regions[j] for j in retry], params)):
                tensor = self._tensor(img)
                if tensor is not None and tuple(tensor.shape[:2]) == (heads[j].height, heads[j].width):
                    images[j] = tensor
        return images, None if boxes is None else np.array(boxes, np.int64).reshape(-1, 4)

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


class Staging:
    """A ring of pinned host buffers for arrays on their way to ``device``: ``send(arrays)`` copies them into
    one slot (each at a 64-byte boundary) and sends the slot in one ``non_blocking`` copy on the current
    stream, returning a tensor of each on the device; a slot is written again only once its copy has
    finished.  ``reserve(specs)`` hands out the next slot's arrays to be filled first (a batch read straight
    into it): ``send`` of those arrays then copies nothing on the host.  On a device that is not CUDA (the CPU,
    ``meta``): the arrays as tensors there, no pinning, nothing reserved."""

    def __init__(self, device, slots: int = 4) -> None:
        self.device = torch.device(device)
        self.staged = self.device.type == "cuda"
        self.buffers: List[Optional[torch.Tensor]] = [None] * slots
        self.events: list = [None] * slots
        self.next = 0
        self._reserved: Optional[int] = None
        self._lock = threading.Lock()

    def reserve(self, specs: Sequence[Tuple[tuple, Any]]) -> Optional[List[np.ndarray]]:
        """Arrays of these (shape, dtype) in the next slot, laid out as ``send`` lays them (None off CUDA)."""
        if not self.staged:
            return None
        offsets, end = _layout(specs)
        with self._lock:
            k = self._reserved = self._slot(end)
        host = self.buffers[k].numpy()
        return [host[at:at + _nbytes(shape, dtype)].view(dtype).reshape(shape)
                for (shape, dtype), at in zip(specs, offsets)]

    def send(self, arrays: Sequence[np.ndarray]) -> List[torch.Tensor]:
        if not self.staged:
            return [torch.from_numpy(np.ascontiguousarray(a)).to(self.device) for a in arrays]
        offsets, end = _layout([(a.shape, a.dtype) for a in arrays])
        with self._lock:
            k, self._reserved = self._reserved, None
            if k is None or self.buffers[k].numel() < end or not any(
                    _placed(a, self.buffers[k], at) for a, at in zip(arrays, offsets)):
                k = self._slot(end)
        host = self.buffers[k].numpy()
        for a, at in zip(arrays, offsets):
            if not _placed(a, self.buffers[k], at):
                np.copyto(host[at:at + a.nbytes].view(a.dtype).reshape(a.shape), a)
        return self._ship(k, end, arrays, offsets)

    def _slot(self, end: int) -> int:
        """The next slot, at least ``end`` bytes, once its last copy has finished."""
        k, self.next = self.next, (self.next + 1) % len(self.buffers)
        if self.events[k] is not None:
            self.events[k].synchronize()
        if self.buffers[k] is None or self.buffers[k].numel() < end:
            self.buffers[k] = self._buffer(max(end, 1 << 20))
        return k

    def _buffer(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def _ship(self, k: int, end: int, arrays: Sequence[np.ndarray], offsets: Sequence[int]) -> List[torch.Tensor]:
        dev = self.buffers[k][:end].to(self.device, non_blocking=True)
        self.events[k] = torch.cuda.Event()
        self.events[k].record(torch.cuda.current_stream(self.device))
        return [dev[at:at + a.nbytes].view(_TORCH[a.dtype]).view(a.shape) for a, at in zip(arrays, offsets)]


def _nbytes(shape: tuple, dtype: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _layout(specs: Sequence[Tuple[tuple, Any]]) -> Tuple[List[int], int]:
    """(each array's offset in a slot, at a 64-byte boundary; the bytes the slot needs)."""
    offsets, end = [], 0
    for shape, dtype in specs:
        offsets.append(end)
        end += -(-_nbytes(shape, dtype) // 64) * 64
    return offsets, end


def _placed(array: np.ndarray, buffer: torch.Tensor, at: int) -> bool:
    """Whether ``array`` already lies, C-contiguous, at byte ``at`` of ``buffer`` (reserved and filled)."""
    return array.flags.c_contiguous and array.ctypes.data == buffer.data_ptr() + at


_TORCH = {np.dtype(np.uint8): torch.uint8, np.dtype(np.int64): torch.int64, np.dtype(np.float32): torch.float32,
          np.dtype(np.bool_): torch.bool}


def plan_array(plans) -> np.ndarray:
    """A batch's plans as one N x 9 int64 array (box, scaled, offset, flip): what ``bands`` reads, small
    enough to send with the batch."""
    plans = geometry.Plans.of(plans)
    return np.concatenate([plans.box, plans.scaled, plans.offset, plans.flip[:, None]], 1).astype(np.int64)


def taps(plans, size: Size) -> Tuple[int, int]:
    """(row taps, column taps) a batch's ``bands`` need: 2 x the widest support + 2."""
    plans = geometry.Plans.of(plans)
    out = []
    for k, length in ((1, size[0]), (0, size[1])):
        scale = (plans.box[:, k + 2] - plans.box[:, k]) / plans.scaled[:, k]
        out.append(int(math.ceil(2 * max(float(scale.max(initial=1.0)), 1.0))) + 2)
    return out[0], out[1]


def bands(params: torch.Tensor, size: Size, in_len: int, axis: int, count: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(N x out x ``count`` int64 source pixels, N x out x ``count`` float32 weights) of each plan's antialiased
    bilinear resampling along one axis (``axis`` 0: rows, 1: columns) of images ``in_len`` pixels long
    there, from ``params`` (``plan_array``, on the device): Pillow's triangle filter, widened by the scale
    when shrinking, over the box's pixels only (crop, then resize), a few taps an output pixel; outputs
    outside a pad's image have no weight (black); a flip reverses the columns.  Made on the params'
    device in a few batched operations, from N x 9 numbers: nothing per pixel crosses from the host."""
    out_len, k = (size[0] if axis == 0 else size[1]), 1 - axis  # (x, y) pairs: columns use x, rows y
    p = params.to(torch.float64)
    b0, b1, scaled, offset = p[:, k, None], p[:, k + 2, None], p[:, 4 + k, None], p[:, 6 + k, None]
    j = torch.arange(out_len, dtype=torch.float64, device=params.device)[None, :]
    col = torch.where(scaled >= out_len, j + offset, j - offset)  # crop: the kept window's; pad: the image's
    scale = (b1 - b0) / scaled
    support = scale.clamp(min=1.0)
    centre = b0 + (col + 0.5) * scale
    first = torch.floor(centre - support - 0.5)
    i = first[..., None] + torch.arange(count, dtype=torch.float64, device=params.device)  # N x out x T
    w = (1 - (i + 0.5 - centre[..., None]).abs_() / support[..., None]).clamp_(min=0)
    w = w * ((i >= b0[..., None]) & (i < b1[..., None]) & ((col >= 0) & (col < scaled))[..., None])
    w = w / w.sum(2, keepdim=True).clamp_(min=1e-12)  # a pad's border: all zero, stays zero
    index = i.clamp_(0, in_len - 1).to(torch.int64)
    if axis == 1:
        flip = params[:, 8, None, None].bool()
        w, index = torch.where(flip, w.flip(1), w), torch.where(flip, index.flip(1), index)
    return index, w.to(torch.float32)


def _pass(x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, dim: int) -> torch.Tensor:
    """One axis of the resampling: N x C x h x w (any dtype) -> float32, ``dim`` (2 rows, 3 columns)
    taking the output's length from ``index`` (N x out x T): T gathers, each added with its weights."""
    n, c = x.shape[:2]
    out = None
    for t in range(index.shape[2]):
        if dim == 2:
            idx, w = index[:, None, :, t, None].expand(n, c, -1, x.shape[3]), weights[:, None, :, t, None]
        else:
            idx, w = index[:, None, None, :, t].expand(n, c, x.shape[2], -1), weights[:, None, None, :, t]
        taken = torch.gather(x, dim, idx)
        out = taken * w if out is None else out.addcmul_(taken, w)
    return out


def crop_resize_batch(images: torch.Tensor, plans, size: Size, params: Optional[torch.Tensor] = None
                      ) -> torch.Tensor:
    """uint8 N x 3 x h x w (any device; samples may be smaller than h x w, top-left, their plans' boxes
    within them) -> uint8 N x 3 x H x W (channels_last), sample ``j`` rendered by ``plans[j]`` (box,
    antialiased bilinear resize, crop or pad, flip) in a few batched kernels whatever the plans: the
    banded weights of rows then columns (``bands``), made on the device from ``params`` (``plan_array``
    of ``plans``, already there: the device stage sends it with the batch), else from ``plans``."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"expected N x 3 x h x w images, got {tuple(images.shape)}")
    if len(plans) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(plans)} plans")
    H, W = size
    n, _, h, w = images.shape
    if n == 0:
        return torch.empty((0, 3, H, W), dtype=torch.uint8, device=images.device, memory_format=torch.channels_last)
    if params is None:
        params = torch.from_numpy(plan_array(plans)).to(images.device)
    row_taps, col_taps = taps(plans, size)
    rows_i, rows_w = bands(params, size, h, 0, row_taps)
    cols_i, cols_w = bands(params, size, w, 1, col_taps)
    plain = torch.autocast(images.device.type, enabled=False) if images.device.type in ("cuda", "cpu") else \
        nullcontext()  # a caller's bf16/fp16 autocast: still float32 (the meta device has no autocast)
    with plain:
        if H * w <= h * W:  # the smaller intermediate first
            x = _pass(_pass(images, rows_i, rows_w, 2), cols_i, cols_w, 3)
        else:
            x = _pass(_pass(images, cols_i, cols_w, 3), rows_i, rows_w, 2)
    out = torch.empty((n, 3, H, W), dtype=torch.uint8, device=images.device, memory_format=torch.channels_last)
    out.copy_(x.round_().clamp_(0, 255))
    return out
