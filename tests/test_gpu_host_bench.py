"""benchmarks/gpu_host.py runs on the CPU (the meta device and a stand-in decoder in place of the GPU's) and
reports, for encoded JPEGs and stored pixels, the host µs per image of each part, the torch calls per batch
and the rate one core sustains.  Figures are not judged here (no timing asserts): only that they are there
and that the stand-in made the batches the stage would."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_image

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_host.py"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_host") / "img"
    for i in range(6):
        write_image(root / "a" / f"{i}.jpg", size=(90 + 13 * i, 70 + 7 * i), seed=i, fmt="JPEG")
    return root


def test_the_script_reports_every_part_for_both_kinds(images, tmp_path):
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--images", str(images), "--batch", "8", "--batches", "2",
                          "--pixels", "64", "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {r["kind"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"encoded", "stored"}
    for row in rows.values():
        for key in ("read_us", "plans_us", "stage_us", "host_us_per_image", "cuda_estimate_us_per_image",
                    "cpu_path_us_per_image"):
            assert row[key] >= 0
        assert row["one_core_img_per_s"] > 0 and row["kernels_per_batch"] > 0
        assert row["ops_per_batch"] >= row["kernels_per_batch"]
    assert rows["encoded"]["gpu_region_decodes"] > 0  # random crops of unrotated JPEGs: their boxes alone
    assert "encoded" in run.stdout and "stored" in run.stdout


def test_the_stand_in_decodes_to_the_sizes_nvimgcodec_would(images):
    """The stand-in's images have the region's size (a box) or the header's, so the stage renders them
    into the batch the real decoder's would make."""
    spec = importlib.util.spec_from_file_location("gpu_host", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from pixfeed.image import geometry, gpu
    from pixfeed.seeds import uniforms

    records = [p.read_bytes() for p in sorted(images.rglob("*.jpg"))]
    heads = [gpu.gpu_head(r) for r in records]
    w, h = (list(v) for v in zip(*(head.oriented for head in heads)))
    plans = geometry.plans(w, h, (24, 20), "random", uniforms(0, 0, range(len(records))))
    dec = bench.StandInDecoder()
    images_, boxes = dec._gpu_images(records, heads, plans)
    for img, box, p in zip(images_, boxes, plans):
        assert tuple(img.shape) == (p.box[3] - p.box[1], p.box[2] - p.box[0], 3) and tuple(box[:2]) == (0, 0)
    out = dec.decode(records, plans, (24, 20), heads)
    assert out.device.type == "meta" and tuple(out.shape) == (len(records), 3, 24, 20)
