"""Fuzz (issues #39, #43): tar headers (PAX, GNU long names, sparse members; plain and .tar.gz), manifests
(every entry varied), data files (mmap, LMDB, HDF5: truncated, or bytes of their headers changed) and index
rows from a stranger end in a named pixfeed error or in success, within a time limit, and touch nothing
outside the folders they were given.

Only that is asserted: which inputs are refused is the other tests' business.  Each example runs under
a SIGALRM deadline, so a hang fails the example instead of the suite; a canary folder beside the input
is checked unchanged after every example.
"""
from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from conftest import deadline, make_tree
from pixfeed.errors import PixfeedError

SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


def jpeg(seed: int = 0) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 6), (seed * 50 % 256, 100, 30)).save(out, "JPEG")
    return out.getvalue()


JPEG = jpeg()


class Place:
    """A work folder for one example's input, and a canary folder beside it that must stay as it was."""

    def __init__(self, root: Path) -> None:
        self.root, self.work, self.canary = root, root / "work", root / "outside"
        self.canary.mkdir(parents=True, exist_ok=True)
        (self.canary / "canary.txt").write_text("canary")

    def fresh(self) -> Path:
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir()
        return self.work

    def check(self) -> None:
        assert sorted(p.name for p in self.canary.iterdir()) == ["canary.txt"]
        assert (self.canary / "canary.txt").read_text() == "canary"
        assert sorted(p.name for p in self.root.iterdir()) == sorted(["work", "outside", *self.extra])

    extra: tuple = ()


def outcome(fn) -> object:
    """fn()'s result, or the PixfeedError it raised; anything else fails the example."""
    try:
        with deadline(10):
            return fn()
    except PixfeedError as e:
        assert str(e), "a pixfeed error names what is wrong"
        return e


# ---- tar headers ----

NAMES = st.sampled_from([b"a.jpg", b"a.txt", b"a.json", b"a.cls", b"a.npy", b"b.jpg", b"a.x.png", b"../up.txt",
                         b"/abs.jpg", b"a\xff.txt", b"d/", b"PaxHeader/a"]) | st.binary(max_size=12)
SIZE_BYTES = st.sampled_from(list(b"01234567 -+\0\x80\xffa"))
KINDS = st.sampled_from([b"0", b"\0", b"5", b"x", b"g", b"2", b"1", b"6", b"3", b"L", b"K", b"S"]) | \
    st.binary(min_size=1, max_size=1)
PAX_KEYS = st.sampled_from([b"path", b"size", b"linkpath", b"hdrcharset", b"GNU.sparse.size", b"comment",
                            b"GNU.sparse.major", b"GNU.sparse.minor", b"GNU.sparse.name", b"GNU.sparse.realsize",
                            b"GNU.sparse.numblocks", b"GNU.sparse.map"])
PAX_VALUES = st.sampled_from([b"-1536", b"abc", b"", b"99999999999999", b"12", b"a.jpg", b"../x", b"1", b"0",
                              b"0,512,1024,512"]) | st.binary(max_size=8)
BIG = (1 << 20) + 4096  # an extension's data past the 1 MiB it may hold: zeros or a repeated name


@st.composite
def tar_member(draw) -> bytes:
    name, kind = draw(NAMES), draw(KINDS)
    if kind == b"x":
        records = b""
        for _ in range(draw(st.integers(1, 3))):
            body = b" " + draw(PAX_KEYS) + b"=" + draw(PAX_VALUES) + b"\n"
            n = len(body) + 1
            while len(str(n)) + len(body) != n:
                n += 1
            records += str(n + draw(st.sampled_from([0, 0, 0, 1, -3]))).encode() + body
        data = records
    elif kind in (b"L", b"K"):  # a GNU long (link) name: short, long, or past the limit
        data = draw(st.sampled_from([b"n" * 150 + b".jpg\0", b"a.jpg", b"n" * BIG, bytes(BIG)]))
    elif kind == b"S":  # a GNU sparse member's data, with or without extension blocks
        data = draw(st.sampled_from([b"x" * 512, bytes(512), b"\xff" * 1024]))
    else:
        data = draw(st.sampled_from([JPEG, b"3", b"-2", b"x" * 700, b"", b"[[[[", b"\x93NUMPY",
                                     b"1\n" + b"0\n" * 2 + b"999999999\n"]))
    field = b"%011o\0" % len(data) if draw(st.booleans()) else bytes(draw(st.lists(SIZE_BYTES, min_size=12,
                                                                                     max_size=12)))
    h = bytearray(512)
    h[:len(name[:100])] = name[:100]
    h[100:108], h[108:116], h[116:124], h[136:148] = b"0000444\0", b"0000000\0", b"0000000\0", b"00000000000\0"
    h[124:136], h[156:157], h[257:265] = field, kind, b"ustar\x0000"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % (sum(h) + draw(st.sampled_from([0, 0, 0, 0, 1])))
    return bytes(h) + data + bytes(-len(data) % 512)


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Place:
    return Place(tmp_path_factory.mktemp("fuzz"))


@settings(max_examples=150, **SETTINGS)
@given(members=st.lists(tar_member(), min_size=1, max_size=4), ending=st.sampled_from([bytes(1024), b"", bytes(700)]),
       on_error=st.sampled_from(["fail", "skip"]), gz=st.booleans())
def test_tar_headers(place, members, ending, on_error, gz):
    """Plain shards are walked (seeking), .tar.gz ones streamed through tarfile: both ways in."""
    import gzip

    from pixfeed.sources.shards import scan_shards

    src = place.fresh() / "src"
    src.mkdir()
    good = JPEG + bytes(-len(JPEG) % 512)
    head = bytearray(512)
    head[:5], head[100:108], head[124:136], head[156:157], head[257:265] = \
        b"0.jpg", b"0000444\0", b"%011o\0" % len(JPEG), b"0", b"ustar\x0000"
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\0 " % sum(head)
    data = bytes(head) + good + b"".join(members) + ending
    if gz:
        (src / "s-000000.tar.gz").write_bytes(gzip.compress(data, compresslevel=1))
    else:
        (src / "s-000000.tar").write_bytes(data)
    outcome(lambda: scan_shards(src, on_error=on_error))
    place.check()


# ---- manifests ----

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
                    | st.text(max_size=6) | st.sampled_from(["../outside/canary.txt", "/etc/hostname", "keys.json",
                                                            "data.bin", 10 ** 12, -1, 60000, "a\0b", 2 ** 63,
                                                            10 ** 4000, 1e308, "\n\x1b[2J"]),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> dict:
    from pixfeed.cli import main

    root = tmp_path_factory.mktemp("packed")
    src = make_tree(root / "src", classes=("a", "b"), per_class=1)
    out = {}
    for fmt, store in (("mmap", "pixels"), ("wds", "encoded"), ("lmdb", "encoded"), ("hdf5", "pixels"),
                       ("mmap-encoded", "encoded")):
        size = ["--size", "8"] if store == "pixels" else []
        assert main(["pack", str(src), str(root / fmt), "--format", fmt.split("-")[0], "--store", store, *size,
                     "-q"]) == 0
        out[fmt] = root / fmt
    return out


MANIFEST_KEYS = ["count", "shape", "keys_file", "key_index", "shards", "files", "classes", "schema", "chunks", "per_box",
                 "skipped", "notes", "source", "options", "checksum", "store", "format", "magic", "layout_version",
                 "created", "pixfeed_version"]


@settings(max_examples=80, **SETTINGS)
@given(fmt=st.sampled_from(["mmap", "wds", "lmdb", "hdf5"]), edits=st.lists(st.tuples(
    st.sampled_from(MANIFEST_KEYS), JSON, st.booleans()), min_size=1, max_size=3), nested=st.booleans())
def test_manifests(place, packed, fmt, edits, nested):
    from pixfeed.datasets import open_dataset
    from pixfeed.verify.check import verify

    ds = place.fresh() / "ds"
    shutil.copytree(packed[fmt], ds)
    m = json.loads((ds / "pixfeed.json").read_text())
    for key, value, remove in edits:
        if remove:
            m.pop(key, None)
        elif nested and isinstance(m.get(key), dict) and m[key]:  # change one entry of an object
            m[key][sorted(m[key])[0]] = value
        else:
            m[key] = value
    (ds / "pixfeed.json").write_text(json.dumps(m))
    report = outcome(lambda: verify(ds))
    assert isinstance(report, PixfeedError) or isinstance(report.problems, list)

    def read_one():
        opened = open_dataset(ds)
        return next(iter(opened)) if fmt == "wds" else opened[0]
    outcome(read_one)
    place.check()


# ---- data files: truncated, or bytes of their headers changed ----

@settings(max_examples=60, **SETTINGS)
@given(fmt=st.sampled_from(["mmap", "mmap-encoded", "lmdb", "hdf5"]), which=st.integers(0, 20),
       cut=st.one_of(st.none(), st.floats(0, 1)), at=st.integers(0, 4095) | st.floats(0, 1),
       new=st.binary(min_size=1, max_size=8) | st.sampled_from([b"\xff" * 8, bytes(8), b"\x7f\xff\xff\xff"]),
       recorded=st.booleans())
def test_data_files(place, packed, fmt, which, cut, at, new, recorded):
    """A data file (images.npy, offsets.npy, labels.npy, checksums.npy, data.mdb, data.h5, ...) cut short
    or with a few bytes changed (``at``: a byte of its first 4 KiB, where the headers are, or a fraction of
    its length), the manifest made to agree with it or not: verify and reading every record end in a
    verdict or a named error, in a forked child (a crash, SIGBUS or SIGSEGV, fails the example instead of
    the session)."""
    from pixfeed.checksum import file_hash

    ds = place.fresh() / "ds"
    shutil.copytree(packed[fmt], ds)
    m = json.loads((ds / "pixfeed.json").read_text())
    names = sorted(n for n in m["files"] if not n.startswith("keys"))
    name = names[which % len(names)]
    data = bytearray((ds / name).read_bytes())
    if cut is not None:
        del data[int(cut * len(data)):]
    else:
        pos = at if isinstance(at, int) else int(at * len(data))
        data[pos:pos + len(new)] = new
    (ds / name).write_bytes(bytes(data))
    if recorded:
        m["files"][name] = {"bytes": len(data), "xxh3_64": file_hash(ds / name)}
        m.pop("chunks", None)
        (ds / "pixfeed.json").write_text(json.dumps(m))
    assert in_child(lambda: _read_everything(ds)) == 0
    place.check()


def _read_everything(ds: Path) -> None:
    from pixfeed.datasets import open_dataset
    from pixfeed.verify.check import verify

    report = outcome(lambda: verify(ds))
    assert isinstance(report, PixfeedError) or isinstance(report.problems, list)

    def read_all():
        opened = open_dataset(ds)
        for i in range(len(opened)):
            opened[i]
    outcome(read_all)


def in_child(fn) -> int:
    """``fn()`` in a forked child: its exit status (0: it returned; 1: it raised; a signal's number + 128:
    killed by it), its error's traceback printed by the child."""
    import traceback

    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
        except BaseException:  # noqa: BLE001 - the parent asserts on the status
            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


# ---- index rows ----

CELLS = JSON | st.sampled_from(["0.jpg", "1.jpg", "../outside/canary.txt", "/etc/hostname", "\x1b[31mred", "nan",
                                 "[" * 2000, str(2 ** 70), "-5", ""])
COLUMNS = st.sampled_from(["image", "label", "x", "y", "../outside/victim", "my caption"]) | st.text(max_size=4)


@settings(max_examples=120, **SETTINGS)
@given(rows=st.lists(st.dictionaries(COLUMNS, CELLS, max_size=4), min_size=1, max_size=4),
       kind=st.sampled_from([".jsonl", ".csv"]))
def test_index_rows(place, rows, kind):
    from pixfeed.sources.index import scan_index

    src = place.fresh() / "src"
    src.mkdir()
    for i in range(2):
        (src / f"{i}.jpg").write_bytes(jpeg(i))
    index = src / f"i{kind}"
    if kind == ".jsonl":
        index.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        header = sorted({k for r in rows for k in r})
        import csv
        with open(index, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            for r in rows:
                w.writerow([r.get(k, "") if isinstance(r.get(k, ""), str) else json.dumps(r[k]) for k in header])
    outcome(lambda: scan_index(index, src))
    place.check()


def test_the_canary_check_sees_a_write_outside(place):
    """The fuzz tests' check fails when something is written beside the input."""
    place.fresh()
    (place.canary / "canary.txt").write_text("changed")
    with pytest.raises(AssertionError):
        place.check()
    (place.canary / "canary.txt").write_text("canary")
    (place.root / "stray").write_text("x")
    with pytest.raises(AssertionError):
        place.check()
    os.unlink(place.root / "stray")
    place.check()

