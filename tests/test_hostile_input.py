"""Issue #39 items 7 and 8: hostile input ends in bounded time and memory, with one named error.

Every input is made here by hand: tar headers written byte by byte, index files, edited manifests, a
FIFO and a link to /dev/zero.  Commands that hung before run in a subprocess with a timeout (a
regression fails, it does not hang the suite); in-process calls run under ``deadline`` (SIGALRM).
"""
from __future__ import annotations

import csv
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from PIL import Image

from conftest import deadline
from pixfeed.cli import main
from pixfeed.errors import DamagedTarError, OverLimitError, PixfeedError
from pixfeed.storage import bounded

CLI = [sys.executable, "-c", "import sys; from pixfeed.cli import main; sys.exit(main())"]


# ---- hand-written tar members ----

def header(name: bytes, size_field: bytes, kind: bytes = b"0") -> bytes:
    """A ustar header with any bytes as its size field, its checksum right."""
    h = bytearray(512)
    h[:len(name)] = name
    h[100:108], h[108:116], h[116:124] = b"0000444\0", b"0000000\0", b"0000000\0"
    h[124:136] = size_field.ljust(12, b"\0")[:12]
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def member(name: bytes, data: bytes, kind: bytes = b"0") -> bytes:
    return header(name, b"%011o\0" % len(data), kind) + data + bytes(-len(data) % 512)


def pax(name: bytes, key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return member(b"PaxHeader/" + name, str(n).encode() + body, b"x")


def jpeg(seed: int = 0) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (16, 12), (seed * 40 % 256, 90, 160)).save(out, "JPEG")
    return out.getvalue()


def shard(folder: Path, *parts: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "s-000000.tar"
    path.write_bytes(b"".join(parts) + bytes(1024))
    return folder


def run(*args, timeout: float = 30) -> subprocess.CompletedProcess:
    """The CLI in a subprocess; a hang is a failed test after ``timeout`` seconds."""
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def one_line_error(r: subprocess.CompletedProcess, *words: str, code: int = 2) -> str:
    """The error line of a command that failed as it should: exit ``code``, one line, no traceback."""
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("pixfeed: error:")]
    assert len(lines) == 1, r.stderr[-2000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def in_process(capsys, *args) -> tuple:
    """(exit code, stdout, stderr) of the CLI run here, within 30 s; an uncaught exception fails the test."""
    with deadline(30):
        code = main([str(a) for a in args])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


# ---- item 7: hangs and unbounded memory ----

@pytest.mark.parametrize("bad", [
    header(b"a.txt", b"-0000001000") + b"x" * 512,                    # ustar size field, negative
    pax(b"a.txt", b"size", b"-1536") + member(b"a.txt", b"hello"),     # PAX size, negative
], ids=["ustar", "pax"])
def test_negative_tar_size_ends_the_pack(tmp_path, bad):
    src = shard(tmp_path / "src", member(b"a.jpg", jpeg()), bad)
    r = run("pack", src, tmp_path / "dst", "--format", "mmap", "-q")
    one_line_error(r, "s-000000.tar", "negative")
    assert not (tmp_path / "dst").exists()
    # the same shard, bucket-like (bytes in memory): the walk ends too
    from pixfeed.sources import _tarwalk
    with deadline(10), pytest.raises(DamagedTarError, match="negative"):
        list(_tarwalk.samples(io.BytesIO((src / "s-000000.tar").read_bytes())))


def test_negative_size_taken_by_tarfiles_fallback_ends():
    """A GNU long name sends the shard to tarfile, which loops on a negative size by itself."""
    long_name = b"n" * 150 + b".txt"
    data = member(b"././@LongLink", long_name + b"\0", b"L") + header(b"x.txt", b"-0000001000") + bytes(1536)
    from pixfeed.sources import _tarwalk
    with deadline(10), pytest.raises(DamagedTarError):
        _tarwalk.members(io.BytesIO(data))


@pytest.fixture(scope="module")
def wds_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wds")
    src = root / "src"
    src.mkdir()
    for i in range(4):
        (src / f"{i}.jpg").write_bytes(jpeg(i))
    assert main(["pack", str(src), str(root / "ds"), "--format", "wds", "--store", "encoded", "-q"]) == 0
    return root / "ds"


def test_negative_size_in_a_packed_shard_ends_read_loader_and_verify(wds_dataset, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(wds_dataset, ds)
    tar = next(ds.glob("*.tar"))
    data = bytearray(tar.read_bytes())
    second = tarfile.open(fileobj=io.BytesIO(bytes(data))).getmembers()[1].offset  # a header after the first
    data[second:second + 512] = header(b"0001.json", b"-0000001000")
    tar.write_bytes(bytes(data))
    from pixfeed import make_loader, open_dataset
    with deadline(30), pytest.raises(PixfeedError, match="negative"):
        list(open_dataset(ds, checksums=False, shuffle=False))
    with deadline(30), pytest.raises(PixfeedError):
        list(make_loader(open_dataset(ds, shuffle=False), batch_size=2, num_workers=0))
    r = run("verify", ds, "-q")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "negative" in r.stdout, (r.stdout, r.stderr)


def test_fifo_and_link_to_dev_zero_in_src(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(jpeg())
    os.mkfifo(src / "zz.jpg")
    one_line_error(run("pack", src, tmp_path / "d1", "-q"), "zz.jpg", "FIFO")
    os.unlink(src / "zz.jpg")
    os.symlink("/dev/zero", src / "zero.jpg")
    one_line_error(run("pack", src, tmp_path / "d2", "-q"), "zero.jpg", "device")
    os.mkfifo(src / "zz.jpg")
    r = run("pack", src, tmp_path / "d3", "-q", "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "d3" / "pixfeed.json").read_text())
    assert manifest["count"] == 1 and {s["path"] for s in manifest["skipped"]} == {"zz.jpg", "zero.jpg"}


def test_read_file_bounds_what_it_reads(tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:
        f.truncate(10 << 20)  # sparse
    with pytest.raises(OverLimitError, match="over pixfeed's limit"):
        bounded.read_file(big, 1 << 20)
    assert bounded.read_file(big, 10 << 20) == bytes(10 << 20)


def test_verify_on_a_count_of_10_to_the_12(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(jpeg())
    assert main(["pack", str(src), str(tmp_path / "ds"), "--format", "mmap", "-q", "--size", "8"]) == 0
    path = tmp_path / "ds" / "pixfeed.json"
    m = json.loads(path.read_text())
    path.write_text(json.dumps({**m, "count": 10 ** 12}))
    one_line_error(run("verify", tmp_path / "ds"), "pixfeed.json", "count 1,000,000,000,000")
    path.write_text(json.dumps({**m, "count": 2}))  # within the files' bytes, more than the arrays hold
    r = run("verify", tmp_path / "ds", "-q")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "count is 2" in r.stdout, (r.stdout, r.stderr)
    one_line_error(run("pack", tmp_path / "ds", tmp_path / "re", "-q"), "holds 1 records", "count is 2")


def test_bench_with_an_image_that_does_not_decode(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(jpeg(i))
    (src / "bad.jpg").write_bytes(jpeg()[:200])  # a JPEG cut short
    r = run("bench", src, "--out", tmp_path / "out", "--formats", "mmap", "--epochs", "1", "-q", timeout=90)
    one_line_error(r, "bad.jpg")


def test_a_sparse_100_gb_member_is_not_read(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    head = member(b"a.jpg", jpeg()) + header(b"a.txt", b"%011o\0" % (100 << 30))
    with open(src / "s-000000.tar", "wb") as f:
        f.write(head)
        f.truncate(len(head) + (100 << 30) + 1024)  # sparse: no disk used
    one_line_error(run("pack", src, tmp_path / "dst", "-q"), "a.txt", "over pixfeed's limit")


def test_jsonl_rows_that_each_add_a_column_stay_linear(tmp_path):
    from pixfeed.sources.tables import read_table
    rows = "".join(json.dumps({"image": f"{i}.jpg", f"c{i}": 1}) + "\n" for i in range(20_000))  # 700 KB
    with deadline(10), pytest.raises(OverLimitError, match="columns"):
        read_table(Path("i.jsonl"), rows.encode())
    # a real sparse column (one row in 20 has it) still reads, in row order
    rows = "".join(json.dumps({"image": f"{i}.jpg", "label": i % 3, **({"note": "x"} if i % 20 == 0 else {})}) + "\n"
                   for i in range(2_000))
    with deadline(10):
        columns, names, _ = read_table(Path("i.jsonl"), rows.encode())
    assert list(columns) == ["image", "label", "note"] and len(names) == 2_000
    assert columns["note"][:21] == ["x"] + [None] * 19 + ["x"]


# ---- item 8: named errors instead of tracebacks ----

@pytest.mark.parametrize("members,words", [
    ([pax(b"a.txt", b"size", b"abc"), member(b"a.txt", b"hi")], ["size='abc'"]),
    ([member(b"a.json", b"[" * 100_000 + b"]" * 100_000)], ["a.json", "nested"]),
    ([member(b"a.cls", str(2 ** 70).encode())], ["a.cls", "64-bit"]),
    ([member(b"a.cls", b"-7")], ["a.cls", "-7"]),
    ([member(b"a.npy", b"\x93NUMPY\x01\x00v\x00" + b"{'descr': '|u1', 'fortran_order': False, 'shape': "
                                                    b"(8796093022208,), }".ljust(117) + b"\n")], ["a.npy", "declares"]),
    ([member(b"a\xff.txt", b"hi")], ["UTF-8"]),
    ([member(b"a.jpg", jpeg(1))], ["a.jpg twice"]),
], ids=["pax-size-abc", "json-100k-deep", "cls-2**70", "cls-below-minus-1", "npy-8-tib", "not-utf8", "jpg-twice"])
def test_shard_members_give_named_errors(tmp_path, members, words):
    src = shard(tmp_path / "src", member(b"a.jpg", jpeg()), *members)
    with deadline(30):
        code = main(["pack", str(src), str(tmp_path / "dst"), "-q"])
    assert code == 2
    r = run("pack", src, tmp_path / "dst", "-q")
    one_line_error(r, "s-000000.tar", *words)
    if "-7" in words:
        return  # labels below -1 are refused for the whole source (issue #38's label rule)
    # --on-error skip leaves the sample (or the rest of its shard) out, listed in the manifest
    src2 = shard(tmp_path / "src2", member(b"b.jpg", jpeg(2)))
    os.replace(shard(tmp_path / "bad", member(b"a.jpg", jpeg()), *members) / "s-000000.tar", src2 / "s-000001.tar")
    with deadline(30):
        assert main(["pack", str(src2), str(tmp_path / "dst2"), "-q", "--on-error", "skip"]) == 0
    manifest = json.loads((tmp_path / "dst2" / "pixfeed.json").read_text())
    assert 1 <= manifest["count"] <= 2 and manifest["skipped"]


def test_fifo_and_device_members_are_noted(tmp_path):
    src = shard(tmp_path / "src", member(b"a.jpg", jpeg()), member(b"a.txt", b"", b"6"), member(b"b.jpg", jpeg(1)))
    with deadline(30):
        assert main(["pack", str(src), str(tmp_path / "dst"), "-q"]) == 0
    notes = json.loads((tmp_path / "dst" / "pixfeed.json").read_text())["notes"]
    assert any("a.txt" in n and "FIFO" in n for n in notes), notes


def write_index(root: Path, name: str, rows: list, text: str = "") -> Path:
    root.mkdir(exist_ok=True)
    for i in range(2):
        (root / f"{i}.jpg").write_bytes(jpeg(i))
    path = root / name
    if text:
        path.write_text(text)
    elif name.endswith(".csv"):
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_csv_cells_over_128_kib_pack(tmp_path, capsys):
    polygon = json.dumps([[i * 0.5, i * 0.25] for i in range(20_000)])  # ~400 KB, one cell
    index = write_index(tmp_path / "src", "i.csv", [{"image": "0.jpg", "poly": polygon},
                                                    {"image": "1.jpg", "poly": "[[1.0, 2.0]]"}])
    code, _, err = in_process(capsys, "pack", tmp_path / "src", tmp_path / "dst", "--index", index,
                              "--field", "poly:json", "-q")
    assert code == 0, err
    from pixfeed import open_dataset
    ds = open_dataset(tmp_path / "dst", fields=("poly",), size=8)
    assert ds[0][0] == json.loads(polygon)


@pytest.mark.parametrize("name,rows,text,words", [
    ("i.jsonl", None, '{"image": "0.jpg", "x": ' + "[" * 10_000 + "]" * 10_000 + "}\n", ["line 1", "nested"]),
    ("i.jsonl", None, '{"image": "0.jpg", "label": NaN}\n{"image": "1.jpg", "label": 1}\n', ["line 1", "nan"]),
    ("i.csv", [{"image": "0.jpg", "label": str(2 ** 70)}, {"image": "1.jpg", "label": "1"}], "", ["line 2", "64-bit"]),
    ("i.csv", [{"image": "0.jpg", "x": "y" * (65 << 20)}], "", ["line 2", "limit"]),
], ids=["jsonl-10k-deep", "nan-label", "label-2**70", "cell-over-64-mib"])
def test_index_files_give_named_errors(tmp_path, capsys, name, rows, text, words):
    index = write_index(tmp_path / "src", name, rows, text)
    code, _, err = in_process(capsys, "pack", tmp_path / "src", tmp_path / "dst", "--index", index, "-q")
    assert code == 2 and err.count("\n") == 1 and str(index) in err, err
    for word in words:
        assert word in err, err


def test_an_http_src_is_refused_by_name(tmp_path, capsys):
    (tmp_path / "a.jpg").write_bytes(jpeg())
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        code, _, err = in_process(capsys, "pack", url, tmp_path / "dst", "-q")
    finally:
        server.shutdown()
    assert code == 2 and "cannot be listed" in err, err


@pytest.fixture(scope="module")
def mmap_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mmap")
    src = root / "src"
    for c in ("cat", "dog"):
        (src / c).mkdir(parents=True)
        for i in range(2):
            (src / c / f"{i}.jpg").write_bytes(jpeg(i))
    assert main(["pack", str(src), str(root / "ds"), "--format", "mmap", "--size", "16", "-q"]) == 0
    return root / "ds"


EDITS = {
    "shape-60000": lambda m: m.update(shape=[60000, 60000, 3]),
    "no-keys-file": lambda m: m.pop("keys_file"),
    "key-index-text": lambda m: m.update(key_index="x"),
    "shards-text": lambda m: m.update(shards="x"),
    "source-number": lambda m: m.update(source=5),
    "skipped-number": lambda m: m.update(skipped=5),
    "per-box-number": lambda m: m.update(per_box=5),
    "no-checksum": lambda m: m.pop("checksum"),
    "count-plus-one": lambda m: m.update(count=m["count"] + 1),
    "chunks-text": lambda m: m.update(chunks="x"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_damaged_manifests_give_a_verdict_or_a_named_error(mmap_dataset, tmp_path, capsys, edit):
    ds = tmp_path / "ds"
    shutil.copytree(mmap_dataset, ds)
    m = json.loads((ds / "pixfeed.json").read_text())
    EDITS[edit](m)
    (ds / "pixfeed.json").write_text(json.dumps(m))
    for args, codes in ((["verify", ds, "-q"], (0, 1, 2)), (["info", ds], (0, 2)),
                        (["pack", ds, tmp_path / "re", "-q"], (0, 2))):
        code, out, err = in_process(capsys, *args)
        assert code in codes, (args, code, out, err)
        if code == 2:
            assert err.count("\n") == 1 and str(ds) in err, err
        shutil.rmtree(tmp_path / "re", ignore_errors=True)


def test_control_characters_from_input_are_escaped(tmp_path, capsys):
    index = write_index(tmp_path / "src", "i.csv", [{"image": "0.jpg", "label": "\x1b[31mred\x1b[0m"},
                                                    {"image": "1.jpg", "label": "b\x1b]0;pwn\x07"}])
    code, _, err = in_process(capsys, "pack", tmp_path / "src", tmp_path / "dst", "--index", index, "-q")
    assert code == 0, err
    code, out, _ = in_process(capsys, "info", tmp_path / "dst")
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[31mred" in out
    index = write_index(tmp_path / "src", "j.csv", [{"image": "\x1b[2Jgone.jpg"}])
    code, _, err = in_process(capsys, "pack", tmp_path / "src", tmp_path / "dst2", "--index", index, "-q")
    assert code == 2 and "\x1b" not in err and "\\x1b[2Jgone" in err, err


def test_one_bomb_limit_in_the_message(monkeypatch):
    from pixfeed.errors import ImageDecodeError
    from pixfeed.image.pillow import open_image
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    out = io.BytesIO()
    Image.new("L", (200, 200)).save(out, "PNG")  # 40,000 pixels: Pillow's error, quoting twice its limit
    with pytest.raises(ImageDecodeError) as e:
        open_image(out.getvalue(), "x.png", 5_000)
    assert "limit of 5000 pixels" in str(e.value) and "20000" not in str(e.value)


# ---- leftovers: a path given where a dataset goes ----

@pytest.mark.parametrize("given", ["path/to/ds", Path("path/to/ds"), b"path/to/ds"], ids=["str", "path", "bytes"])
def test_make_loader_refuses_a_path(given):
    from pixfeed import make_loader
    from pixfeed.errors import OptionError
    with deadline(10), pytest.raises(OptionError, match=r"open_dataset\('path/to/ds'\)"):
        make_loader(given, 4, num_workers=0)


# ---- leftovers: a dataset's key files ----

def keyed_dataset(mmap_dataset, tmp_path, *, index: bool) -> tuple:
    """(a copy of the packed dataset, its manifest path, a canary file beside it), with or without its key index."""
    ds = tmp_path / "ds"
    shutil.copytree(mmap_dataset, ds)
    canary = tmp_path / "canary.txt"
    canary.write_text("outside")
    if not index:
        m = json.loads((ds / "pixfeed.json").read_text())
        m.pop("key_index")
        (ds / "pixfeed.json").write_text(json.dumps(m))
    return ds, canary


def sparse(path: Path, size: int) -> None:
    path.unlink()
    with open(path, "wb") as f:
        f.truncate(size)


@pytest.mark.parametrize("how", ["fifo", "over-limit", "not-a-list"])
def test_keys_json_is_read_bounded(mmap_dataset, tmp_path, how):
    from pixfeed import open_dataset
    from pixfeed.errors import CorruptDataError, SpecialFileError
    ds, canary = keyed_dataset(mmap_dataset, tmp_path, index=False)
    keys = ds / "keys.json"
    if how == "fifo":
        keys.unlink()
        os.mkfifo(keys)
    elif how == "over-limit":
        sparse(keys, bounded.MANIFEST_BYTES + 1)
    else:
        keys.write_text('{"a": 1}')
    error = {"fifo": SpecialFileError, "over-limit": OverLimitError, "not-a-list": CorruptDataError}[how]
    with deadline(10), pytest.raises(error, match="keys"):
        open_dataset(ds).key(0)
    assert canary.read_text() == "outside"


@pytest.mark.parametrize("how", ["blob-fifo", "offsets-fifo", "offsets-past-the-file", "blob-over-limit",
                                 "offsets-fall"])
def test_the_key_index_is_read_bounded(mmap_dataset, tmp_path, how):
    import numpy as np

    from pixfeed import keyindex, open_dataset
    from pixfeed.errors import CorruptDataError, SpecialFileError
    ds, canary = keyed_dataset(mmap_dataset, tmp_path, index=True)
    blob, offsets = ds / keyindex.BLOB, ds / keyindex.OFFSETS
    n = len(np.load(offsets)) - 1
    if how.endswith("fifo"):
        path = blob if how == "blob-fifo" else offsets
        path.unlink()
        os.mkfifo(path)
        error = SpecialFileError
    elif how == "offsets-past-the-file":  # a key of 10**12 bytes: refused, not allocated
        np.save(offsets, np.array([0] + [10 ** 12] * n, np.uint64))
        error = CorruptDataError
    elif how == "blob-over-limit":
        sparse(blob, bounded.MANIFEST_BYTES + 1)
        np.save(offsets, np.array([0] + [bounded.MANIFEST_BYTES + 1] * n, np.uint64))
        error = OverLimitError
    else:
        np.save(offsets, np.array([0, 5] + [1] * (n - 1), np.uint64))
        error = CorruptDataError
    with deadline(10), pytest.raises(error):
        [open_dataset(ds).key(i) for i in range(n)]
    with deadline(10), pytest.raises(error):
        open_dataset(ds).keys()
    assert canary.read_text() == "outside"


# ---- leftovers: .tar.gz shards as plain ones; a bucket's shards as local ones ----

def gz_shard(folder: Path, *parts: bytes) -> Path:
    import gzip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "s-000000.tar.gz").write_bytes(gzip.compress(b"".join(parts) + bytes(1024)))
    return folder


@pytest.mark.parametrize("members,code,words", [
    ([member(b"a.txt", b"", b"6")], 0, ["'a.txt', a FIFO"]),
    ([member(b"a.txt", b"", b"2")], 0, ["'a.txt', a symbolic link"]),
    ([member(b"a.txt", b"", b"1")], 0, ["'a.txt', a hard link"]),
    ([member(b"a.txt", b"", b"3")], 0, ["'a.txt', a character device"]),
    ([member(b"a.jpg", jpeg(1))], 2, ["a.jpg twice"]),
    ([member(b"b.jpg", jpeg(1)), member(b"a.jpg", jpeg(2))], 2, ["a.jpg twice"]),
    ([header(b"a.txt", b"-0000001000") + b"x" * 512], 2, ["negative size (-512)"]),
    ([pax(b"a.txt", b"size", b"abc"), member(b"a.txt", b"hi")], 2, ["size='abc'"]),
    ([header(b"a.txt", b"abc") + b"x" * 512], 2, ["not valid"]),
], ids=["fifo", "symlink", "hardlink", "device", "twice", "twice-apart", "negative", "pax-abc", "ustar-abc"])
@pytest.mark.parametrize("gz", [False, True], ids=["tar", "tar.gz"])
def test_gz_shards_give_the_errors_and_notes_of_plain_ones(tmp_path, capsys, members, code, words, gz):
    canary = tmp_path / "canary.txt"
    canary.write_text("outside")
    src = (gz_shard if gz else shard)(tmp_path / "src", member(b"a.jpg", jpeg()), *members, member(b"c.jpg", jpeg(3)))
    got, _, err = in_process(capsys, "pack", src, tmp_path / "dst", "-q")
    assert got == code, err
    if code:
        assert err.count("\n") == 1 and "s-000000.tar" in err and all(w in err for w in words), err
    else:
        notes = json.loads((tmp_path / "dst" / "pixfeed.json").read_text())["notes"]
        assert any(all(w in n for w in words) for n in notes), notes
    assert canary.read_text() == "outside"


@pytest.mark.parametrize("size", [b"-0000001000", b"abc"], ids=["negative", "not-a-number"])
def test_a_bad_header_in_a_bucket_shard_ends_in_a_named_error(wds_dataset, bucket, s3_server, tmp_path, size):
    """A bucket's wds shards are streamed (not walked as local ones are): the same header checks hold."""
    from pixfeed import open_dataset
    from pixfeed.storage.store import Store
    so, url = s3_server.options, f"{bucket}/ds"
    store = Store(url, so)
    for path in wds_dataset.iterdir():
        data = path.read_bytes()
        if path.suffix == ".tar":
            second = tarfile.open(fileobj=io.BytesIO(data)).getmembers()[1].offset
            data = data[:second] + header(b"0001.json", size) + data[second + 512:]
        store.write(path.name, data)
    with deadline(30), pytest.raises(DamagedTarError, match="negative" if size.startswith(b"-") else "not valid"):
        list(open_dataset(url, checksums=False, shuffle=False, storage_options=so, cache_dir=tmp_path / "cache"))


# ---- leftovers: one bad header late in a shard ----

@pytest.mark.parametrize("bad", [header(b"x.txt", b"-0000001000") + b"x" * 512, header(b"x.txt", b"abc") + b"x" * 512,
                                 pax(b"x.txt", b"size", b"abc") + member(b"x.txt", b"hi")],
                         ids=["negative", "not-a-number", "pax-abc"])
@pytest.mark.parametrize("gz", [False, True], ids=["tar", "tar.gz"])
def test_skip_keeps_the_samples_before_a_damaged_header(tmp_path, capsys, bad, gz):
    good = [member(b"%s.%s" % (k, e), jpeg(i) if e == b"jpg" else b"%d" % i)
            for i, k in enumerate([b"a", b"b", b"c"]) for e in (b"jpg", b"cls")]
    src = (gz_shard if gz else shard)(tmp_path / "src", *good, bad, member(b"d.jpg", jpeg(4)), member(b"d.cls", b"1"))
    code, _, err = in_process(capsys, "pack", src, tmp_path / "dst", "-q")
    assert code == 2 and "s-000000.tar" in err and "byte" in err, err
    code, _, err = in_process(capsys, "pack", src, tmp_path / "dst", "-q", "--on-error", "skip")
    assert code == 0, err
    manifest = json.loads((tmp_path / "dst" / "pixfeed.json").read_text())
    keys = json.loads((tmp_path / "dst" / "keys.json").read_text())
    # a and b kept; c, whose members might go on past the damage, and d after it, left out with the reason
    assert sorted(keys) == ["a", "b"], keys
    (entry,) = manifest["skipped"]
    assert "s-000000.tar" in entry["path"] and f"byte {len(b''.join(good))}" in entry["reason"], entry
    assert "the rest of the shard is left out" in entry["reason"], entry


# ---- leftovers: Parquet read a row group at a time ----

def test_parquet_is_read_a_row_group_at_a_time_with_every_row_in_order():
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from pixfeed.sources.tables import read_table
    image = pa.StructArray.from_arrays([pa.array([jpeg(i) for i in range(5)], pa.binary()),
                                        pa.array([f"{i}.jpg" for i in range(5)])], ["bytes", "path"])
    table = pa.table({"image": image, "label": [0, 1, None, 1, 0], "note": ["a", None, "c", "d", "e"]})
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=2)
    assert pq.ParquetFile(io.BytesIO(out.getvalue())).num_row_groups == 3
    with deadline(10):
        columns, rows, is_text = read_table(Path("i.parquet"), out.getvalue())
    assert columns == {name: table.column(name).to_pylist() for name in table.column_names}
    assert rows == [f"row {i}" for i in range(5)] and not is_text
    empty = io.BytesIO()
    pq.write_table(table.slice(0, 0), empty)
    columns, rows, _ = read_table(Path("e.parquet"), empty.getvalue())
    assert rows == [] and list(columns) == ["image", "label", "note"]
    with pytest.raises(PixfeedError, match="not a readable Parquet"):
        read_table(Path("b.parquet"), out.getvalue()[:-100])
