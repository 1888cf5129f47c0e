"""Issue #43 items 6-12, 14 and 15: hostile input ends in bounded time and memory, with one named error.

Each input is made here: a valid pack edited by hand (a truncated LMDB file with its manifest made to
agree, an HDF5 file whose arrays lie about their shape), index files, tar headers.  A command that
crashed (SIGBUS) or hung before runs in a subprocess with a timeout; memory is checked by what the
code refuses to ask for, not by measuring RSS.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import deadline
from pixfeed.checksum import file_hash
from pixfeed.cli import main
from pixfeed.errors import CorruptDataError, PixfeedError
from pixfeed.storage.paths import remove_tree
from test_hostile_input import in_process, jpeg, one_line_error, run


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A function (format, store) -> a small packed dataset of 8 images in 2 classes, made once."""
    root = tmp_path_factory.mktemp("packed")
    src = root / "src"
    for c in ("cat", "dog"):
        (src / c).mkdir(parents=True)
        for i in range(4):
            (src / c / f"{i}.jpg").write_bytes(jpeg(i))
    made = {}

    def make(fmt: str, store: str) -> Path:
        if (fmt, store) not in made:
            dst = root / f"{fmt}-{store}"
            size = ["--size", "8"] if store == "pixels" else []
            assert main(["pack", str(src), str(dst), "--format", fmt, "--store", store, *size, "-q"]) == 0
            made[fmt, store] = dst
        return made[fmt, store]
    return make


def copy(packed_root: Path, tmp_path: Path) -> Path:
    ds = tmp_path / "ds"
    shutil.copytree(packed_root, ds)
    return ds


def refile(ds: Path, name: str) -> None:
    """Record ``name``'s new size and hash in the manifest: the damage is the dataset's own, as a stranger's
    dataset would come, not a mismatch the file check already names."""
    m = json.loads((ds / "pixfeed.json").read_text())
    m["files"][name] = {"bytes": (ds / name).stat().st_size, "xxh3_64": file_hash(ds / name)}
    m.pop("chunks", None)
    (ds / "pixfeed.json").write_text(json.dumps(m))


# ---- item 14: a truncated LMDB file is a named error, not SIGBUS ----

CHILD = """
import contextlib, io, json, sys
import pixfeed
from pixfeed.cli import main
out = []
for ds in sys.argv[1:]:
    d = pixfeed.open_dataset(ds)
    try:
        [d[i] for i in range(len(d))]
        read = "read"
    except pixfeed.errors.CorruptDataError as e:
        read = str(e)
    codes = []
    for args in (["verify", ds, "-q"], ["pack", ds, ds + "-re", "--format", "mmap", "-q"]):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            codes.append((main(args), stdout.getvalue(), stderr.getvalue()))
    out.append([read, codes])
print(json.dumps(out))
"""


def test_a_truncated_lmdb_file_is_named_in_every_path(packed, tmp_path):
    """Cut at a page, inside one, and one page short, in both stores: reads, verify and a repack (all in
    one child: SIGBUS would kill it) give a CorruptDataError naming the file."""
    made = []
    for store in ("pixels", "encoded"):
        for keep in (8192, 12288 + 100, -4096):
            ds = copy(packed("lmdb", store), tmp_path / f"{store}{keep}")
            data = ds / "data.mdb"
            os.truncate(data, keep if keep > 0 else data.stat().st_size + keep)
            refile(ds, "data.mdb")
            made.append(str(ds))
    r = subprocess.run([sys.executable, "-c", CHILD, *made], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    for ds, (read, ((verify, out, _), (pack, _, err))) in zip(made, json.loads(r.stdout)):
        assert "data.mdb" in read and "truncated" in read, (ds, read)
        assert verify == 1 and "records not checked" in out and "truncated" in out, (ds, out)
        assert pack == 2 and "truncated" in err and err.count("\n") == 1, (ds, err)
        assert not Path(ds + "-re").exists()


def test_an_lmdb_file_that_is_no_lmdb_is_named(packed, tmp_path, capsys):
    ds = copy(packed("lmdb", "encoded"), tmp_path)
    (ds / "data.mdb").write_bytes(b"\x00" * 8192)
    refile(ds, "data.mdb")
    code, out, err = in_process(capsys, "pack", ds, tmp_path / "re", "-q")
    assert code == 2 and "data.mdb" in err and "not an LMDB file" in err, err


# ---- item 8: HDF5 arrays checked against the manifest before a read ----

def rewrite_h5(ds: Path, name: str, shape: tuple, dtype, chunks=None, maxshape=None) -> None:
    """data.h5 with ``name`` replaced by an empty dataset of ``shape`` (HDF5 keeps no bytes for unwritten
    chunks: a dataset of any size costs a few KB on disk)."""
    import h5py
    old, new = ds / "data.h5", ds / "new.h5"
    with h5py.File(old, "r") as f, h5py.File(new, "w") as g:
        for key in f:
            if key != name:
                f.copy(key, g)
        g.attrs.update(f.attrs)
        g.create_dataset(name, shape, dtype, chunks=chunks, maxshape=maxshape)
    new.replace(old)
    refile(ds, "data.h5")


H5_LIES = {
    "images-30000-square": ("images", lambda n: (n, 30000, 30000, 3), np.uint8, lambda n: (1, 30000, 30000, 3), None,
                            "shape"),
    "images-float": ("images", lambda n: (n, 8, 8, 3), np.float64, None, None, "float64"),
    "images-huge-chunks": ("images", lambda n: (n, 8, 8, 3), np.uint8, lambda n: (1 << 22, 8, 8, 3),
                           lambda n: (None, 8, 8, 3), "chunks"),
    "labels-text": ("labels", lambda n: (n,), "S8", None, None, "labels"),
    "labels-float": ("labels", lambda n: (n,), np.float32, None, None, "labels"),
    "labels-2d": ("labels", lambda n: (n, 2), np.int64, None, None, "labels"),
    "checksums-short": ("checksums", lambda n: (n - 1,), np.uint64, None, None, "checksums"),
}


@pytest.mark.parametrize("lie", sorted(H5_LIES))
def test_hdf5_arrays_that_disagree_with_the_manifest_are_named(packed, tmp_path, capsys, lie):
    name, shape, dtype, chunks, maxshape, word = H5_LIES[lie]
    ds = copy(packed("hdf5", "pixels"), tmp_path)
    n = json.loads((ds / "pixfeed.json").read_text())["count"]
    rewrite_h5(ds, name, shape(n), dtype, chunks and chunks(n), maxshape and maxshape(n))
    from pixfeed import open_dataset
    with deadline(30), pytest.raises(CorruptDataError, match=word):
        open_dataset(ds)[0]
    code, out, err = in_process(capsys, "verify", ds, "-q")
    assert code == 1 and "records not checked" in out and word in out, (out, err)
    code, out, err = in_process(capsys, "pack", ds, tmp_path / "re", "--format", "mmap", "-q")
    assert code == 2 and word in err and err.count("\n") == 1, err


def test_encoded_hdf5_of_another_dtype_is_named(packed, tmp_path):
    ds = copy(packed("hdf5", "encoded"), tmp_path)
    n = json.loads((ds / "pixfeed.json").read_text())["count"]
    rewrite_h5(ds, "encoded", (n, 4), np.uint8)
    from pixfeed import open_dataset
    with deadline(30), pytest.raises(CorruptDataError, match="shape"):
        open_dataset(ds)[0]


def test_a_file_hdf5_cannot_open_is_named(packed, tmp_path, capsys):
    ds = copy(packed("hdf5", "pixels"), tmp_path)
    data = ds / "data.h5"
    data.write_bytes(data.read_bytes()[:600])
    refile(ds, "data.h5")
    code, out, err = in_process(capsys, "pack", ds, tmp_path / "re", "--format", "mmap", "-q")
    assert code == 2 and "data.h5" in err and "HDF5 cannot open" in err, err
    code, out, err = in_process(capsys, "verify", ds, "-q")
    assert code == 1 and "HDF5 cannot open" in out, out


# ---- item 9: --index and --class-names read as bounded regular files ----

def limited_run(*args, memory: int = 3 << 30, timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI in a subprocess whose address space is capped at ``memory`` (generous: a pack takes well
    under it), so a read that grows without end fails fast instead of exhausting the machine."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    code = "import sys; from pixfeed.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap)


@pytest.fixture
def index_src(tmp_path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(jpeg())
    (tmp_path / "index.csv").write_text("path,label\na.jpg,0\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    return src


@pytest.mark.parametrize("option", ["--index", "--class-names"])
def test_a_fifo_as_index_or_class_names_is_refused_unopened(index_src, tmp_path, capsys, option):
    index = [] if option == "--index" else ["--index", tmp_path / "index.csv"]
    code, out, err = in_process(capsys, "pack", index_src, tmp_path / "dst", "--format", "mmap", "--size", "8",
                                *index, option, tmp_path / "fifo", "-q")
    assert code == 2 and f"{option} {tmp_path / 'fifo'}: is a FIFO" in err, err
    assert not (tmp_path / "dst").exists()


def test_a_link_to_dev_zero_as_index_or_class_names_is_refused_unread(index_src, tmp_path):
    for args in (["--index", tmp_path / "zero"], ["--index", tmp_path / "index.csv", "--class-names", tmp_path / "zero"]):
        r = limited_run("pack", index_src, tmp_path / "dst", "--format", "mmap", "--size", "8", *args, "-q")
        one_line_error(r, str(args[-1]), "is a device")
    r = limited_run("bench", index_src, "--index", tmp_path / "zero", "--formats", "mmap")
    one_line_error(r, "zero", "is a device")


def test_an_index_over_its_limit_is_refused_before_it_is_read(index_src, tmp_path, capsys, monkeypatch):
    import pixfeed.sources.index as index_module
    monkeypatch.setattr(index_module, "INDEX_BYTES", 10)
    code, out, err = in_process(capsys, "pack", index_src, tmp_path / "dst", "--index", tmp_path / "index.csv", "-q")
    assert code == 2 and "index.csv" in err and "limit of 10 bytes" in err, err


# ---- item 10: a bucket's manifest and index within the same limits as local ones ----

def test_a_bucket_manifest_or_index_over_the_limit_is_refused_fetching_no_more(
        packed, bucket, s3_server, tmp_path, monkeypatch):
    from pixfeed import open_dataset
    from pixfeed.errors import OverLimitError
    from pixfeed.storage import bounded
    from pixfeed.storage.store import Store
    so, url = s3_server.options, f"{bucket}/ds"
    store = Store(url, so)
    local = packed("mmap", "pixels")
    for path in local.iterdir():
        store.write(path.name, path.read_bytes() + (b" " * 4000 if path.name == "pixfeed.json" else b""))
    store.write("index.csv", b"path,label\n" + b"a.jpg,0\n" * 500)
    fetched = []
    read_range = Store.read_range
    monkeypatch.setattr(Store, "read_range", lambda self, name, start, end: fetched.append((name, end)) or
                        read_range(self, name, start, end))
    size = len(store.read("pixfeed.json"))
    monkeypatch.setattr(bounded, "MANIFEST_BYTES", size - 1)
    with deadline(30), pytest.raises(OverLimitError, match="pixfeed.json"):
        open_dataset(url, storage_options=so, cache_dir=tmp_path / "cache")
    assert fetched == [("pixfeed.json", size)]  # one byte past the limit, no more
    monkeypatch.setattr(bounded, "MANIFEST_BYTES", size)
    assert len(open_dataset(url, storage_options=so, cache_dir=tmp_path / "cache")) == 8
    import pixfeed.sources.index as index_module
    monkeypatch.setattr(index_module, "INDEX_BYTES", 1000)
    src = tmp_path / "src"
    src.mkdir()
    with deadline(30), pytest.raises(OverLimitError, match="index.csv"):
        from pixfeed.sources.index import scan_index
        scan_index(f"{url}/index.csv", src, storage_options=so)


# ---- item 11: what parsing a manifest may build is bounded; verify parses it once ----

def test_a_manifest_of_empty_lists_is_refused_before_it_is_parsed(packed, tmp_path, capsys, monkeypatch):
    """16 MiB of empty lists is ~300 MB of Python lists a parse: refused by its text's estimate, in every
    command, before json builds anything."""
    ds = copy(packed("mmap", "pixels"), tmp_path)
    m = json.loads((ds / "pixfeed.json").read_text())
    text = json.dumps(m)[:-1] + ', "skipped": [' + ",".join(["[]"] * (5 << 20)) + "]}"
    (ds / "pixfeed.json").write_text(text)
    parsed = []
    monkeypatch.setattr(json, "loads", lambda *a, **k: parsed.append(1) or pytest.fail("parsed"))
    for args, want in ((["verify", ds, "-q"], 2), (["info", ds], 2), (["pack", ds, tmp_path / "re", "-q"], 2)):
        code, out, err = in_process(capsys, *args)
        assert code == want and "pixfeed.json" in err and "objects" in err and err.count("\n") == 1, (args, err)
    assert not parsed


def test_verify_parses_the_manifest_once(packed, capsys, monkeypatch):
    from pixfeed.storage import bounded
    loads, parsed = bounded.loads, []
    monkeypatch.setattr(bounded, "loads", lambda text, where, *a: parsed.append(str(where)) or loads(text, where, *a))
    for fmt, store in (("mmap", "pixels"), ("lmdb", "encoded"), ("wds", "encoded")):
        parsed.clear()
        code, out, err = in_process(capsys, "verify", packed(fmt, store), "-q")
        assert code == 0, (out, err)
        assert sum(w.endswith("pixfeed.json") for w in parsed) == 1, parsed


# ---- item 6: a Parquet index whose cells expand far past its bytes ----

def parquet_bombs(folder: Path) -> dict:
    """{name: path} of small Parquet files that decode to far more than their bytes, each by another way
    in (the compressed one to 64 MiB: the test lowers the limit rather than write 256 MiB)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    out, n = {}, 2048
    out["dictionary"] = folder / "dictionary.parquet"  # one 1 MiB value named by every row: 2 GiB in ~1 KB
    note = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(["a" * (1 << 20)]))
    pq.write_table(pa.table({"path": pa.array(["a.jpg"] * n), "note": note}), out["dictionary"],
                   compression="zstd", row_group_size=n)
    out["compressed"] = folder / "compressed.parquet"  # plain pages, compressed 20,000 to 1
    pq.write_table(pa.table({"path": ["a.jpg"] * 64, "note": ["a" * (1 << 20)] * 64}), out["compressed"],
                   compression="zstd", use_dictionary=False)
    out["rows"] = folder / "rows.parquet"  # 6M rows of nulls: 48 MB of pointers, and an object each
    pq.write_table(pa.table({"path": pa.nulls(6 << 20, pa.string())}), out["rows"], row_group_size=6 << 20)
    return out


def test_parquet_bombs_are_refused_before_their_cells_are_made(tmp_path, monkeypatch):
    from pixfeed.errors import OverLimitError
    from pixfeed.sources import tables
    from pixfeed.sources.index import scan_index
    (tmp_path / "src").mkdir()
    bombs = parquet_bombs(tmp_path)
    assert all(p.stat().st_size < 200_000 for p in bombs.values())
    for kind, words in (("dictionary", "bytes of text"), ("rows", "cells")):
        with deadline(30), pytest.raises(OverLimitError, match=words):
            scan_index(bombs[kind], tmp_path / "src")
    monkeypatch.setattr(tables, "CELLS_BYTES", 16 << 20)  # 64 MiB of pages in 4 KB
    with deadline(30), pytest.raises(OverLimitError, match="pages take"):
        scan_index(bombs["compressed"], tmp_path / "src")
    monkeypatch.undo()
    # the CLI, in a child of bounded address space: one named line
    r = limited_run("pack", tmp_path / "src", tmp_path / "dst", "--index", bombs["dictionary"], "-q")
    one_line_error(r, "dictionary.parquet", "repeats values")


def test_a_compressible_parquet_index_of_many_rows_is_read(tmp_path):
    """Real indexes compress well (paths sharing prefixes, labels repeating): 1M rows in ~1.4 MB pass."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pixfeed.sources.tables import read_table
    n = 1 << 20
    pq.write_table(pa.table({"path": [f"c{i % 100}/{i:08d}.jpg" for i in range(n)], "label": [i % 100 for i in range(n)]}),
                   tmp_path / "big.parquet", compression="zstd")
    columns, rows, _ = read_table(tmp_path / "big.parquet", (tmp_path / "big.parquet").read_bytes())
    assert len(columns["path"]) == n and columns["path"][12345] == "c45/00012345.jpg" and columns["label"][-1] == 75


# ---- item 7: tar header extensions (PAX, GNU long names, sparse maps) bounded before they are read ----

def pax_records(name: bytes, *records: tuple, kind: bytes = b"x") -> bytes:
    from test_hostile_input import member
    body = b""
    for key, value in records:
        text = b" " + key + b"=" + value + b"\n"
        n = len(text) + 1
        while len(str(n)) + len(text) != n:
            n += 1
        body += str(n).encode() + text
    return member(b"PaxHeader/" + name, body, kind)


def test_a_huge_pax_header_in_a_sparse_plain_tar_is_not_read(tmp_path):
    from test_hostile_input import header, jpeg as jpg, member
    src = tmp_path / "src"
    src.mkdir()
    big = 3 << 29  # 1.5 GiB of PAX records, a hole on disk
    path = src / "s-000000.tar"
    first = member(b"a.jpg", jpg())
    with open(path, "wb") as f:
        f.write(first + header(b"PaxHeader/b.jpg", b"%011o\0" % big, b"x"))
        f.truncate(f.tell() + big + 1024)
    assert path.stat().st_blocks * 512 < 1 << 20
    r = limited_run("pack", src, tmp_path / "dst", "--format", "mmap", "--size", "8", "-q")
    one_line_error(r, "s-000000.tar", f"PAX header at byte {len(first)}", "1 MiB")


EXTENSIONS = {  # (parts after one good member, words of the error)
    "pax-8mib": (lambda: [pax_records(b"b.jpg", (b"comment", b"x" * (8 << 20)))], ["PAX header", "1 MiB"]),
    "gnu-long-name-8mib": (lambda: [__import__("test_hostile_input").member(b"././@LongLink", b"n" * (8 << 20), b"L")],
                            ["GNU long name", "1 MiB"]),
    "gnu-long-link-8mib": (lambda: [__import__("test_hostile_input").member(b"././@LongLink", b"n" * (8 << 20), b"K")],
                            ["GNU long link name", "1 MiB"]),
    "gnu-sparse-old": (lambda: [__import__("test_hostile_input").member(b"b.jpg", b"x" * 512, b"S")], ["sparse"]),
    "gnu-sparse-1.0": (lambda: [pax_records(b"b.jpg", (b"GNU.sparse.major", b"1"), (b"GNU.sparse.minor", b"0"),
                                            (b"GNU.sparse.name", b"b.jpg"), (b"GNU.sparse.realsize", b"99")),
                                __import__("test_hostile_input").member(b"b.jpg", b"999999999\n" + b"0\n" * 100)],
                       ["sparse"]),
    "global-pax-8mib": (lambda: [pax_records(b"g", (b"comment", b"x" * (8 << 20)), kind=b"g")], ["PAX header", "1 MiB"]),
}


@pytest.mark.parametrize("gz", [False, True], ids=["tar", "tar.gz"])
@pytest.mark.parametrize("kind", sorted(EXTENSIONS))
def test_tar_header_extensions_are_bounded(tmp_path, capsys, kind, gz):
    """Each way in, in a plain shard (walked, seeking) and a .tar.gz (streamed): a named error in bounded
    memory, instead of tarfile reading the extension whole (or walking a sparse map)."""
    from test_hostile_input import gz_shard, member, shard
    parts, words = EXTENSIONS[kind]
    src = (gz_shard if gz else shard)(tmp_path / "src", member(b"a.jpg", jpeg()), *parts())
    code, out, err = in_process(capsys, "pack", src, tmp_path / "dst", "-q")
    assert code == 2 and err.count("\n") == 1 and "s-000000.tar" in err, err
    assert all(w in err for w in words), err


# ---- item 12: pixfeed bench holds a bounded sample of the source, not every image ----

def test_bench_holds_a_bounded_sample_of_the_source(tmp_path, monkeypatch):
    """Two sparse 300 MiB ".jpg" files (a JPEG's first bytes, then a hole) beside three small images: the
    decode ceilings are measured on the small ones, and the sparse ones are never read into memory."""
    from pixfeed.bench import runner
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(jpeg(i))
    for i in (3, 4):
        with open(src / f"{i}.jpg", "wb") as f:
            f.write(jpeg(i)[:64])
            f.truncate(300 << 20)
    from pixfeed.storage.bounded import read_file
    read = []
    monkeypatch.setattr(runner, "read_file", lambda path, *a: read.append(Path(path).name) or read_file(path, *a))
    bench = runner.Bench(runner.BenchConfig(src=tmp_path / "src"), tmp_path / "work")
    assert sorted(read) == ["0.jpg", "1.jpg", "2.jpg"] and len(bench.blobs) == 3
    assert sum(map(len, bench.blobs)) <= runner.DECODE_SAMPLE
    assert bench.source_bytes == sum(p.stat().st_size for p in src.iterdir())
    monkeypatch.setattr(runner, "DECODE_SAMPLE", 100)  # no image fits: named, nothing read
    read.clear()
    with pytest.raises(PixfeedError, match="no source image is under"):
        runner.Bench(runner.BenchConfig(src=tmp_path / "src"), tmp_path / "work")
    assert read == []


# ---- item 15: named errors, not raw tracebacks ----

MANIFEST_EDITS = {
    "files-name-nul": lambda m: m["files"].update({"a\0b": {"bytes": 1, "xxh3_64": "0"}}),
    "skipped-ints": lambda m: m.update(skipped=[1, 2]),
    "skipped-no-path": lambda m: m.update(skipped=[{"reason": "x"}]),
    "skipped-text": lambda m: m.update(skipped=["a"]),
    "source-index-without-index": lambda m: m.update(source={"kind": "index"}),
    "source-shards-float": lambda m: m.update(source={"kind": "shards", "source": 1, "shards": 1e308}),
    "count-past-int64": lambda m: (m["files"]["images.npy"].update(bytes=10 ** 30), m.update(count=10 ** 20)),
    "shape-in-encoded": lambda m: m.update(store="encoded", shape=[1]),
}


@pytest.mark.parametrize("edit", sorted(MANIFEST_EDITS) + ["count-of-5000-digits"])
def test_odd_manifest_entries_give_a_named_error_or_are_shown(packed, tmp_path, capsys, edit):
    ds = copy(packed("mmap", "pixels"), tmp_path)
    m = json.loads((ds / "pixfeed.json").read_text())
    if edit == "count-of-5000-digits":  # past Python's limit on parsing integers (4,300 digits)
        text = json.dumps(m).replace(f'"count": {m["count"]}', '"count": ' + "9" * 5000)
    else:
        MANIFEST_EDITS[edit](m)
        text = json.dumps(m)
    (ds / "pixfeed.json").write_text(text)
    for args in (["info", ds], ["verify", ds, "-q"], ["pack", ds, tmp_path / "re", "-q"]):
        code, out, err = in_process(capsys, *args)
        assert code in (0, 1, 2), (args, code, err)
        assert code != 2 or (err.count("\n") == 1 and "pixfeed.json" in err), (args, err)
        shutil.rmtree(tmp_path / "re", ignore_errors=True)


@pytest.mark.parametrize("name,text,words", [
    ("index.csv", "path,label\na\0.jpg,0\n", ["line 2", "'path'", "NUL"]),
    ("index.jsonl", json.dumps({"path": "a\0.jpg", "label": 0}) + "\n", ["line 1", "NUL"]),
    ("index.csv", "path,label\na.jpg," + "9" * 5000 + "\n", ["line 2", "label", "64-bit"]),
    ("index.csv", "path,label\na.jpg,-" + "9" * 5000 + "\n", ["line 2", "label", "64-bit"]),
], ids=["csv-nul", "jsonl-nul", "csv-5000-digits", "csv-minus-5000-digits"])
def test_index_cells_give_named_errors(tmp_path, capsys, name, text, words):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(jpeg())
    (tmp_path / name).write_text(text)
    code, out, err = in_process(capsys, "pack", src, tmp_path / "dst", "--index", tmp_path / name, "-q")
    assert code == 2 and err.count("\n") == 1 and name in err and all(w in err for w in words), err


def test_a_nul_in_the_index_or_class_names_path_is_named(tmp_path, capsys):
    from pixfeed import pack
    from pixfeed.errors import PixfeedError
    (tmp_path / "src").mkdir()
    for options in ({"index": "a\0.csv"}, {"index": tmp_path / "i.csv", "class_names": "b\0.txt"}):
        (tmp_path / "i.csv").write_text("path,label\na.jpg,0\n")
        with pytest.raises(PixfeedError, match="NUL"):
            pack(tmp_path / "src", tmp_path / "dst", "mmap", size=8, **options)


def npy_edit(name: str, make):
    """An edit replacing ``name`` with ``make(old array)``, recorded in the manifest."""
    def edit(ds: Path) -> None:
        old = np.load(ds / name)
        np.save(ds / name, make(old), allow_pickle=False)
        refile(ds, name)
    return edit


MMAP_EDITS = {  # (store, edit)
    "labels-long": ("pixels", npy_edit("labels.npy", lambda a: np.append(a, 0))),
    "labels-2d": ("pixels", npy_edit("labels.npy", lambda a: np.stack([a, a], 1))),
    "labels-float": ("pixels", npy_edit("labels.npy", lambda a: a.astype(np.float64))),
    "labels-int8": ("pixels", npy_edit("labels.npy", lambda a: a.astype(np.int8))),
    "checksums-short": ("pixels", npy_edit("checksums.npy", lambda a: a[:-1])),
    "checksums-uint32": ("pixels", npy_edit("checksums.npy", lambda a: a.astype(np.uint32))),
    "images-9x9": ("pixels", npy_edit("images.npy", lambda a: np.zeros((len(a), 9, 9, 3), np.uint8))),
    "images-float": ("pixels", npy_edit("images.npy", lambda a: a.astype(np.float32))),
    "images-rank-2": ("pixels", npy_edit("images.npy", lambda a: a.reshape(len(a), -1))),
    "offsets-short": ("encoded", npy_edit("offsets.npy", lambda a: a[:-1])),
    "offsets-float": ("encoded", npy_edit("offsets.npy", lambda a: a.astype(np.float64))),
    "offsets-backwards": ("encoded", npy_edit("offsets.npy", lambda a: a[::-1].copy())),
    "offsets-past-2-gib": ("encoded", npy_edit("offsets.npy", lambda a: a * (1 << 40))),
    "labels-not-npy": ("pixels", lambda ds: ((ds / "labels.npy").write_bytes(b"\x93NUMPY garbage"),
                                             refile(ds, "labels.npy"))),
}


@pytest.mark.parametrize("kind", sorted(MMAP_EDITS))
def test_mmap_arrays_that_disagree_with_the_manifest_are_named(packed, tmp_path, capsys, kind):
    store, edit = MMAP_EDITS[kind]
    ds = copy(packed("mmap", store), tmp_path)
    edit(ds)
    from pixfeed import open_dataset
    with deadline(30), pytest.raises(CorruptDataError):
        d = open_dataset(ds)
        [d[i] for i in range(len(d))]
    code, out, err = in_process(capsys, "verify", ds, "-q")
    assert code == 1 and "Traceback" not in out, (out, err)
    code, out, err = in_process(capsys, "pack", ds, tmp_path / "re", "--format", "lmdb", "-q")
    assert code == 2 and err.count("\n") == 1, err


def test_a_source_nested_1200_deep_is_walked(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "c").mkdir(parents=True)
    (src / "c" / "a.jpg").write_bytes(jpeg())
    try:
        fd = os.open(src / "c", os.O_RDONLY)
        try:
            for _ in range(1200):  # relative to a descriptor: the path is past PATH_MAX long before the end
                os.mkdir("d", dir_fd=fd)
                deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
                os.close(fd)
                fd = deeper
        finally:
            os.close(fd)
        code, out, err = in_process(capsys, "pack", src, tmp_path / "dst", "--format", "mmap", "--size", "8", "-q")
        assert code == 0, err
        assert json.loads((tmp_path / "dst" / "pixfeed.json").read_text())["count"] == 1
    finally:
        remove_tree(src)  # pytest's own clean-up (shutil.rmtree) recurses: a tree this deep left behind breaks it


def test_a_damaged_hdf5_chunk_is_named_in_every_path(tmp_path, capsys):
    """A gzip chunk that does not inflate: h5py's plain OSError becomes a CorruptDataError naming the record."""
    import h5py
    from pixfeed import open_dataset, pack
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"{i}.jpg").write_bytes(jpeg(i))
    ds = tmp_path / "ds"
    pack(src, ds, "hdf5", size=8, store="pixels", compression="gzip")
    with h5py.File(ds / "data.h5", "r") as f:
        chunk = f["images"].id.get_chunk_info(2)
    data = bytearray((ds / "data.h5").read_bytes())
    data[chunk.byte_offset:chunk.byte_offset + chunk.size] = b"\xff" * chunk.size
    (ds / "data.h5").write_bytes(bytes(data))
    refile(ds, "data.h5")
    d = open_dataset(ds)
    with deadline(30), pytest.raises(CorruptDataError, match="record 2 .*HDF5 cannot read it"):
        d[2]
    code, out, err = in_process(capsys, "verify", ds, "-q")
    assert code == 1 and "record 2" in out and "HDF5 cannot read it" in out, out
    code, out, err = in_process(capsys, "pack", ds, tmp_path / "re", "--format", "mmap", "-q")
    assert code == 2 and "HDF5 cannot read it" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("size", [b"77777777777\0", b"\x80" + (1 << 87).to_bytes(11, "big")], ids=["octal-8gb", "base256"])
def test_a_gz_member_claiming_more_than_the_stream_holds_ends(tmp_path, capsys, size):
    """A stream skips a member by reading through it, and tarfile went on reading past the end for as many
    bytes as the header claimed (2**87 in base-256: for ever)."""
    from test_hostile_input import gz_shard, header, member
    src = gz_shard(tmp_path / "src", member(b"a.jpg", jpeg()), header(b"b-no-extension", size) + b"x" * 512)
    code, out, err = in_process(capsys, "pack", src, tmp_path / "dst", "-q")
    assert code == 2 and err.count("\n") == 1 and "b-no-extension" in err and "limit" in err, err


def test_a_folder_pixfeed_removes_goes_at_any_depth_and_never_through_a_link(tmp_path):
    """storage.paths.remove_tree (what replace._remove uses for a temporary folder pixfeed made): a tree
    1,200 deep planted in it goes (shutil.rmtree raised RecursionError on Python 3.11), a link in it is
    removed without touching what it points to."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not pixfeed's")
    top = tmp_path / ".ds.pixfeed-tmp-1"
    top.mkdir()
    (top / "link").symlink_to(outside, target_is_directory=True)
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(1200):
            os.mkdir("d", dir_fd=fd)
            with open(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd), "w") as f:
                f.write("x")
            deeper = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)
    remove_tree(top)
    assert not os.path.lexists(top)
    assert (outside / "keep.txt").read_text() == "not pixfeed's"
    remove_tree(tmp_path / "absent")  # nothing there: nothing raised
