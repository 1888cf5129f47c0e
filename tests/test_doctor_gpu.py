"""pixfeed doctor's GPU decode line: nvImageCodec and nvJPEG against torch's CUDA major, from given metadata."""
from __future__ import annotations

import pytest

from pixfeed.diagnose import gpudecode
from pixfeed.diagnose.gpudecode import check_gpu_decode

CU12 = {"nvidia-nvimgcodec-cu12": "0.9.0.20"}
CU13 = {"nvidia-nvimgcodec-cu13": "0.9.0.20"}
JPEG12 = {"nvidia-nvjpeg-cu12": "12.4.0.76"}
JPEG13 = {"nvidia-nvjpeg": "13.0.2.28"}


def test_nothing_to_say_without_cuda_or_codec():
    assert check_gpu_decode(None, {}, {}) is None


def test_cpu_torch_with_region_codec_is_fine():
    finding = check_gpu_decode(None, CU12, {})
    assert finding.status == "ok" and "CPU backend" in finding.advice


@pytest.mark.parametrize("cuda, extra", [("12.8", "pixfeed[gpu]"), ("13.0", "pixfeed[gpu-cu13]")])
def test_cuda_torch_without_codec_names_the_extra_for_its_major(cuda, extra):
    finding = check_gpu_decode(cuda, {}, {})
    assert finding.status == "info" and f"pip install '{extra}'" in finding.advice


@pytest.mark.parametrize("cuda, codecs, fix", [
    ("13.0", CU12, "pip uninstall -y nvidia-nvimgcodec-cu12 && pip install 'pixfeed[gpu-cu13]'"),
    ("12.4", CU13, "pip uninstall -y nvidia-nvimgcodec-cu13 && pip install 'pixfeed[gpu]'"),
])
def test_codec_for_another_cuda_major_is_a_warning_with_the_fix(cuda, codecs, fix):
    finding = check_gpu_decode(cuda, codecs, {**JPEG12, **JPEG13})
    assert finding.status == "warn" and fix in finding.advice
    assert f"CUDA {cuda.split('.')[0]}" in finding.advice and finding.data["torch_cuda"] == cuda


def test_two_codec_builds_keep_the_one_for_torch():
    finding = check_gpu_decode("13.0", {**CU12, **CU13}, JPEG13)
    assert finding.status == "warn"
    assert "pip uninstall -y nvidia-nvimgcodec-cu12 && pip install --force-reinstall nvidia-nvimgcodec-cu13" \
        in finding.advice


@pytest.mark.parametrize("cuda, codecs, nvjpeg", [("12.8", CU12, JPEG13), ("13.0", CU13, JPEG12),
                                                  ("13.0", CU13, {"nvidia-nvjpeg": "12.9.0.1"})])
def test_missing_nvjpeg_of_the_major_means_cpu_decode(cuda, codecs, nvjpeg):
    finding = check_gpu_decode(cuda, codecs, nvjpeg)
    assert finding.status == "warn" and "no nvJPEG for CUDA" in finding.advice


@pytest.mark.parametrize("cuda, codecs, nvjpeg", [("12.8", CU12, JPEG12), ("13.0", CU13, JPEG13)])
def test_matching_libraries_defer_to_the_gpu_paths_own_check(cuda, codecs, nvjpeg):
    assert check_gpu_decode(cuda, codecs, nvjpeg).status == "ok"
    off = check_gpu_decode(cuda, codecs, nvjpeg, usable=lambda: (False, "compute capability 5.0 is too old"))
    assert off.status == "warn" and "compute capability 5.0" in off.advice and off.data["gpu_path"]


def test_unsupported_cuda_major_says_which_are_supported():
    assert "CUDA 12 or 13" in check_gpu_decode("11.8", {}, {}).advice


def test_reads_installed_versions_from_metadata(monkeypatch):
    versions = {"nvidia-nvimgcodec-cu13": "0.9.0.20", "nvidia-nvjpeg": "13.0.2.28"}

    def version(name):
        if name not in versions:
            raise gpudecode.metadata.PackageNotFoundError(name)
        return versions[name]
    monkeypatch.setattr(gpudecode.metadata, "version", version)
    finding = check_gpu_decode("13.0")
    assert finding.status == "ok" and finding.data["nvimgcodec"] == CU13 and finding.data["nvjpeg"] == JPEG13
