"""Can this machine decode JPEGs on the GPU: nvImageCodec and nvJPEG against torch's CUDA.

pip cannot see torch's CUDA major when it installs an extra, so pixfeed has one extra per major
(``pixfeed[gpu]`` for CUDA 12, ``pixfeed[gpu-cu13]``; ``[region]`` / ``[region-cu13]`` for the CPU
region decode).  ``check_gpu_decode`` reads what is installed from the package metadata (nothing
is imported: nvImageCodec prints errors on import where CUDA libraries are missing) and says
when it does not match ``torch.version.cuda``, with the command that fixes it:

* no CUDA torch and no nvImageCodec: no finding (nothing changes without CUDA);
* two nvImageCodec builds installed: both write ``nvidia/nvimgcodec``, so which one runs is an accident;
* nvImageCodec for another CUDA major than torch's: its GPU decoders cannot load beside torch's CUDA;
* nvJPEG missing for that major: nvImageCodec decodes JPEGs on the CPU only;
* with a usable CUDA device, ``pixfeed.image.gpu.available`` has the last word on whether the GPU path runs.
"""
from __future__ import annotations

from importlib import metadata
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from pixfeed.diagnose.finding import INFO, OK, WARN, Finding

# distribution -> CUDA major it is built for; nvJPEG 13's wheel has no -cu13 suffix (its major is its version's)
CODECS = {"nvidia-nvimgcodec-cu12": 12, "nvidia-nvimgcodec-cu13": 13}
NVJPEG = {"nvidia-nvjpeg-cu12": 12, "nvidia-nvjpeg": None}
EXTRA = {12: "gpu", 13: "gpu-cu13"}
CODEC_OF = {major: name for name, major in CODECS.items()}


def installed(names) -> Dict[str, str]:
    """{distribution: version} of those of ``names`` installed here."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _nvjpeg_majors(nvjpeg: Dict[str, str]) -> Dict[int, str]:
    majors = {}
    for name, version in nvjpeg.items():
        major = NVJPEG.get(name) or int(version.split(".")[0])
        majors[major] = f"{name} {version}"
    return majors


def _install(major: int) -> str:
    return f"pip install 'pixfeed[{EXTRA[major]}]'"


def check_gpu_decode(torch_cuda: Any = "auto", codecs: Optional[Dict[str, str]] = None,
                     nvjpeg: Optional[Dict[str, str]] = None,
                     usable: Optional[Callable[[], Tuple[bool, str]]] = None) -> Optional[Finding]:
    """The GPU decode libraries against torch's CUDA build (``torch_cuda``, e.g. "12.8"); None when neither
    is there ("auto": ``torch.version.cuda``).  ``codecs``/``nvjpeg``: {distribution: version}, read from this
    environment by default; ``usable``: the GPU path's own check, called only when the libraries match."""
    torch_cuda = torch.version.cuda if torch_cuda == "auto" else torch_cuda
    codecs = installed(CODECS) if codecs is None else codecs
    nvjpeg = installed(NVJPEG) if nvjpeg is None else nvjpeg
    major = int(torch_cuda.split(".")[0]) if torch_cuda else None
    jpegs = _nvjpeg_majors(nvjpeg)
    listed = ", ".join(f"{n} {v}" for n, v in {**codecs, **nvjpeg}.items()) or "no nvImageCodec"
    value = f"{listed}; torch CUDA build {torch_cuda or 'none'}"
    data = {"torch_cuda": torch_cuda, "nvimgcodec": codecs, "nvjpeg": nvjpeg}
    if major is None:
        if not codecs:
            return None
        return Finding("gpu decode", value, "CPU-only torch: nvImageCodec's CPU backend serves region decode; "
                       "decoding on the GPU needs a CUDA build of torch", OK, data)
    if major not in EXTRA:
        return Finding("gpu decode", value, f"torch is built for CUDA {torch_cuda}: pixfeed's GPU decode needs a torch "
                       f"built for CUDA {' or '.join(map(str, EXTRA))}", INFO if not codecs else WARN, data)
    if not codecs:
        return Finding("gpu decode", value, f"JPEGs decode on the CPU: {_install(major)} to decode them on the GPU "
                       "(make_loader(..., device='cuda'))", INFO, data)
    if len(codecs) > 1:
        extra = " ".join(n for n in codecs if CODECS[n] != major)
        return Finding("gpu decode", value, f"two nvImageCodec builds share one folder: pip uninstall -y {extra} && "
                       f"pip install --force-reinstall {CODEC_OF[major]}", WARN, data)
    name = next(iter(codecs))
    if CODECS[name] != major:
        return Finding("gpu decode", value, f"{name} is built for CUDA {CODECS[name]}, torch for CUDA {major}: its "
                       f"GPU decoders will not load; pip uninstall -y {name} && {_install(major)}", WARN, data)
    if major not in jpegs:
        return Finding("gpu decode", value, f"no nvJPEG for CUDA {major}: nvImageCodec decodes JPEGs on the CPU "
                       f"only; {_install(major)}", WARN, data)
    if usable is not None:
        ok, reason = usable()
        data["gpu_path"] = reason
        if not ok:
            return Finding("gpu decode", value, f"libraries match, but the GPU path is off: {reason}", WARN, data)
    return Finding("gpu decode", value, f"nvImageCodec and nvJPEG match torch's CUDA {major}: "
                   "make_loader(..., device='cuda') can decode on the GPU", OK, data)


def gpu_path_check() -> Optional[Callable[[], Tuple[bool, str]]]:
    """``pixfeed.image.gpu.available`` on cuda:0 when a CUDA device is usable and the GPU path is built; else None."""
    if not torch.cuda.is_available():
        return None
    try:
        from pixfeed.image import gpu
    except ImportError:
        return None
    return lambda: gpu.available(torch.device("cuda", 0))
