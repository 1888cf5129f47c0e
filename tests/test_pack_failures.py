"""Failures while packing: SIGINT and SIGKILL midway, a full disk, a read-only
destination.  The user gets a message naming DST where one is possible,
temporary output is removed (now, or by the next pack), and an existing
dataset at DST is untouched."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import held_image, make_tree, write_image, sized

from pixfeed import registry
from pixfeed.errors import OutputError
from pixfeed.packers import pack
from pixfeed.packers.mmap import MmapWriter
from pixfeed.verify.check import verify

CASES = [(f, s) for f in sorted(registry.FORMATS) for s in ("pixels", "encoded")]


def _snapshot(dst: Path) -> dict:
    """Every file of a dataset with its bytes, to prove it was not touched."""
    return {p.relative_to(dst).as_posix(): p.read_bytes() for p in sorted(dst.rglob("*")) if p.is_file()}


def _leftovers(parent: Path) -> list:
    return sorted(p.name for p in parent.iterdir() if ".pixfeed-" in p.name)


@pytest.fixture
def existing(tmp_path):
    """(source, DST holding a finished dataset, its snapshot)."""
    src, dst = make_tree(tmp_path / "src"), tmp_path / "out" / "ds"
    dst.parent.mkdir()
    pack(src, dst, "mmap", size=16, workers=1)
    return src, dst, _snapshot(dst)


# ---- signals: the last source image's read held midway (conftest.held_image) -----------------------

def _start_blocked_pack(src: Path, dst: Path, workers: int):
    """Start ``pixfeed pack --overwrite`` and return (process, fifo write end) once it is
    blocked reading the last image (its hold FIFO), with every other image already packed into its
    temporary dir."""
    _, fifo, env = held_image(src / "eel")
    cmd = [sys.executable, "-m", "pixfeed.cli", "pack", str(src), str(dst), "--overwrite", "--size", "16",
           "--workers", str(workers), "-q"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds once the pack opened it to read
            break
        except OSError as e:
            assert e.errno == errno.ENXIO
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail(f"pack never reached the FIFO (exit {proc.poll()}): {proc.communicate()[1]}")
    assert dst.parent.glob(f".{dst.name}.pixfeed-tmp-{proc.pid}"), "no temporary output midway"
    _wait_until_asleep_in_the_fifo(proc.pid)
    return proc, fd


def _wait_until_asleep_in_the_fifo(pid: int) -> None:
    """Wait until the pack (or its pool worker) sleeps in ``read`` on the FIFO and the main
    thread sleeps.  A SIGINT that lands between the pack opening the FIFO and entering
    ``read`` is seen by Python's signal check only after the read, which never returns: a
    race in any Python program, not the hung read Ctrl-C must break."""
    def procs():
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat.parent.name) == pid or int(fields[1]) == pid:  # fields[1]: the parent pid
                yield stat.parent, fields[0]  # fields[0]: the state

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            reading = any("pipe" in (d / "wchan").read_text() for d, _ in procs())
            main_asleep = (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "S"
            hidden = main_asleep and Path(f"/proc/{pid}/wchan").read_text() in ("", "0")
        except OSError:
            hidden = True
        if hidden:  # no /proc, or a kernel that hides wchan: fall back to a pause
            time.sleep(1)
            return
        if reading and main_asleep:
            return
        time.sleep(0.02)
    pytest.fail("the pack never blocked in a read of the FIFO")


@pytest.mark.parametrize("workers", [1, 2])
def test_sigint_midway_removes_temporary_output_and_keeps_dst(existing, workers):
    src, dst, before = existing
    proc, fd = _start_blocked_pack(src, dst, workers)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(fd)
    assert proc.returncode == 130 and "pixfeed: interrupted; nothing was written" in err, err
    assert _leftovers(dst.parent) == [] and _snapshot(dst) == before


def test_sigkill_midway_keeps_dst_and_next_pack_removes_the_debris(existing):
    src, dst, before = existing
    proc, fd = _start_blocked_pack(src, dst, workers=1)
    try:
        proc.kill()
        proc.wait(timeout=60)
    finally:
        os.close(fd)
    assert _leftovers(dst.parent) == [f".ds.pixfeed-tmp-{proc.pid}"]
    assert _snapshot(dst) == before and verify(dst).ok
    (src / "eel" / "zz-hold.jpg.hold").unlink()
    pack(src, dst, "mmap", size=24, workers=1, overwrite=True)
    assert _leftovers(dst.parent) == [] and json.loads((dst / "pixfeed.json").read_text())["shape"] == [24, 24, 3]


def _children(pid: int) -> list:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_of_the_pack_leaves_no_worker_alive(existing):
    """A pool worker blocked in a read of the FIFO would wait forever for a dead parent; it dies with it."""
    src, dst, _ = existing
    proc, fd = _start_blocked_pack(src, dst, workers=2)
    try:
        workers = _children(proc.pid)
        assert workers, "the pack has no pool workers"
        proc.kill()
        proc.wait(timeout=60)
        deadline = time.monotonic() + 5
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, workers)), [w for w in workers if _alive(w)]
        err = proc.stderr.read()
        assert "BrokenPipeError" not in err and "Traceback" not in err, err
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def signal_source(tmp_path_factory) -> Path:
    """Enough images that a pack lasts a while after it starts writing."""
    root = tmp_path_factory.mktemp("signals") / "src"
    for i in range(600):
        write_image(root / ("ab"[i % 2]) / f"{i:03d}.jpg", size=(200, 150), seed=i)
    return root


def test_sigint_at_random_moments_of_packs_always_ends_them_with_nothing_left(signal_source, tmp_path):
    """20 packs (every format, pixels and encoded), each sent SIGINT (to its process group) a random
    moment after it started writing: every one that was still packing exits 130, prints the
    interrupt, and leaves no dataset and no temporary folder.  A signal that came after the pack
    published its dataset (it exits 0, or dies of the SIGINT while Python shuts down) must find
    that dataset whole; most must land while packing."""
    import random

    rng, landed = random.Random(7), 0
    for n in range(20):
        fmt, store = CASES[n % len(CASES)]
        dst = tmp_path / f"ds{n}"
        cmd = [sys.executable, "-m", "pixfeed.cli", "pack", str(signal_source), str(dst), "--format", fmt,
               "--store", store, "--workers", "2", "-q", *(["--size", "64"] if store == "pixels" else [])]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _leftovers(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))  # an encoded pack of these takes about 50 ms
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if proc.returncode in (0, -signal.SIGINT) and (dst / "pixfeed.json").exists():  # it had finished
            assert verify(dst).ok, (fmt, store)
            continue
        landed += 1
        assert proc.returncode == 130 and "pixfeed: interrupted; nothing was written" in err, (fmt, store, err)
        assert not dst.exists() and _leftovers(tmp_path) == [], (fmt, store, sorted(tmp_path.iterdir()))
    assert landed >= 15, f"only {landed} of 20 signals came while packing"


# ---- a full disk ----------------------------------------------------------------------------

def test_enospc_in_a_writer_is_reported_naming_dst(existing, monkeypatch):
    src, dst, before = existing

    def full(self, task, indices, records):
        next(iter(records))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.root / "images.npy"))

    monkeypatch.setattr(MmapWriter, "write_task", full)
    with pytest.raises(OutputError, match=f"cannot write the dataset {dst}: No space left on device .*images.npy"
                                          f".*; nothing was written; the existing {dst} is unchanged") as err:
        pack(src, dst, "mmap", workers=1, overwrite=True)
    assert isinstance(err.value, OSError)  # callers may catch either
    assert _leftovers(dst.parent) == [] and _snapshot(dst) == before


def test_an_interrupt_ends_the_pack_as_interrupted_whatever_it_broke_on_its_way_out(existing, monkeypatch):
    """A SIGINT whose unwinding makes a file operation fail (a descriptor closed twice, as an HDF5
    pack once showed) is still an interrupt: KeyboardInterrupt (the CLI's exit 130), not a write
    error, and nothing is left."""
    src, dst, before = existing

    def broken(self, task, indices, records):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the pack's handler raises KeyboardInterrupt
            time.sleep(5)
        finally:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    monkeypatch.setattr(MmapWriter, "write_task", broken)
    with pytest.raises(KeyboardInterrupt):
        pack(src, dst, "mmap", workers=1, overwrite=True)
    assert _leftovers(dst.parent) == [] and _snapshot(dst) == before


def test_a_signal_while_the_dataset_is_published_leaves_it_published(tmp_path, monkeypatch):
    """SIGINT arriving as the finished pack is renamed into place is held back until the rename is done,
    and then ends nothing: the pack returns its dataset (the CLI exits 0), whole; a later check does
    not raise either.  Before, the KeyboardInterrupt came out of the rename and the CLI said nothing
    was written, with the dataset in place."""
    from pixfeed.packers import interrupt, replace

    src = make_tree(tmp_path / "src")
    real = replace.publish

    def signalled(*args):
        os.kill(os.getpid(), signal.SIGINT)  # held back while the dataset is published
        real(*args)

    monkeypatch.setattr(replace, "publish", signalled)
    m = pack(src, tmp_path / "ds", "mmap", size=16, workers=1)
    assert m["count"] == 12 and verify(tmp_path / "ds").ok and interrupt.published()
    assert _leftovers(tmp_path) == []


@pytest.fixture
def mount(tmp_path):
    """mount(path, size, ro=False): a small tmpfs, unmounted after the test (root only)."""
    mounted = []

    def do(path: Path, size: str, *opts: str) -> Path:
        path.mkdir(exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *opts]), "tmpfs", str(path)],
                           capture_output=True, text=True, check=False)
        if r.returncode != 0:
            pytest.skip(f"a real full or read-only disk needs a tmpfs mount (root with CAP_SYS_ADMIN): {r.stderr}")
        mounted.append(path)
        return path

    yield do
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.mark.parametrize("fmt,store", CASES)
def test_real_full_disk(tmp_path, mount, fmt, store):
    src = make_tree(tmp_path / "src", per_class=8)
    for i in range(2):
        write_image(tmp_path / "small" / f"{i}.jpg", fmt="JPEG", seed=i)
    fs = mount(tmp_path / "fs", "48k")
    dst = fs / "ds"
    pack(tmp_path / "small", dst, fmt, store=store, **sized(store, 16), workers=1)
    before = _snapshot(dst)
    with pytest.raises(OutputError, match=f"cannot write the dataset {dst}: .*No space left on device"):
        pack(src, dst, fmt, store=store, **sized(store, 64), workers=1, overwrite=True)
    assert _leftovers(fs) == [] and _snapshot(dst) == before


_FILL_THEN_COPY = """
import os, sys
from pathlib import Path
from pixfeed.errors import OutputError
from pixfeed.packers import pack
from pixfeed.packers.hdf5 import H5Writer

fs, src, store = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
copy = H5Writer.copy_task

def fill_then_copy(self, first, result):  # the disk fills (another writer) just as records go into data.h5
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while os.write(fd, bytes(4096)):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    copy(self, first, result)

H5Writer.copy_task = fill_then_copy
try:
    pack(src, fs / "ds", "hdf5", store=store, workers=1, **({"size": 16} if store == "pixels" else {}))
except OutputError as e:
    print("refused:", e)
"""


@pytest.mark.parametrize("store", ["pixels", "encoded"])
def test_hdf5_pack_filling_the_disk_ends_with_its_error_not_a_crash(tmp_path, mount, store):
    """A disk that fills while records are copied into data.h5: the pack reports it, and the process then
    exits cleanly.  Before, a dataset whose close failed on the full disk stayed open without its file, and
    HDF5's exit handler crashed the process (SIGSEGV) after the error had been reported."""
    src = make_tree(tmp_path / "src", per_class=4)
    fs = mount(tmp_path / "fs", "256k")
    done = subprocess.run([sys.executable, "-c", _FILL_THEN_COPY, str(fs), str(src), store],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"refused: cannot write the dataset {fs / 'ds'}: No space left on device; nothing was written" \
        in done.stdout
    assert sorted(p.name for p in fs.iterdir()) == ["filler"]


@pytest.mark.parametrize("fmt", ["mmap", "wds"])
def test_blocks_are_reserved_only_for_bytes_to_come(tmp_path, mount, fmt):
    """mmap's data.bin and wds's shards reserve their blocks ahead from the source's sizes, except
    under --max-side, where the re-encoded records take far less: such a pack fits a disk smaller
    than its source.  A pack that cannot fit fails with nothing left."""
    from PIL import Image

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    rng = __import__("numpy").random.default_rng(0)
    for i in range(6):  # noise, 320 x 320: about 120 KB a JPEG, a few KB at max side 48
        Image.fromarray(rng.integers(0, 256, (320, 320, 3), dtype="uint8")).save(src / f"{i}.jpg", quality=95)
    src = src.parent
    source_bytes = sum(p.stat().st_size for p in src.rglob("*.jpg"))
    fs = mount(tmp_path / "fs", "256k")
    assert source_bytes > 2 * 256 * 1024
    m = pack(src, fs / "small", fmt, store="encoded", max_side=48, workers=1)
    assert m["count"] == 6 and verify(fs / "small").ok
    with pytest.raises(OutputError, match="No space left on device"):
        pack(src, fs / "big", fmt, store="encoded", workers=1)
    assert sorted(p.name for p in fs.iterdir()) == ["small"]


def test_read_only_destination(existing, mount, request):
    src, dst, before = existing
    if os.geteuid() == 0:  # root writes through mode bits: use a read-only mount
        fs = mount(dst.parent.parent / "ro", "1m")
        pack(src, fs / "ds", "mmap", size=16, workers=1)
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        dst, before = fs / "ds", _snapshot(fs / "ds")
    else:
        dst.parent.chmod(0o555)
        request.addfinalizer(lambda: dst.parent.chmod(0o755))
    with pytest.raises(OutputError, match=f"cannot write the dataset {dst}: (Read-only file system|Permission"
                                          f" denied).*; nothing was written; the existing {dst} is unchanged"):
        pack(src, dst, "mmap", size=24, workers=1, overwrite=True)
    with pytest.raises(OutputError, match=f"cannot write the dataset {dst.parent / 'new'}"):
        pack(src, dst.parent / "new", "lmdb" if "lmdb" in registry.FORMATS else "mmap", workers=1)
    assert _leftovers(dst.parent) == [] and _snapshot(dst) == before


def test_skip_reason_names_the_file_and_is_the_same_on_every_pack(tmp_path):
    """Pillow names the in-memory buffer it read ("<_io.BytesIO object at 0x...>"): the
    manifest's reason must not carry it, so two packs of one source record the same reasons."""
    src = tmp_path / "src"
    write_image(src / "a" / "ok.jpg", (16, 16))
    (src / "a" / "bad.jpg").write_bytes(b"\xff\xd8\xff" + b"x" * 100)
    reasons = [pack(src, tmp_path / f"out{i}", "mmap", on_error="skip", size=8)["skipped"] for i in range(2)]
    assert reasons[0] == reasons[1] and len(reasons[0]) == 1
    assert "bad.jpg: cannot read JPEG header" in reasons[0][0]["reason"]
    assert "0x" not in reasons[0][0]["reason"]
