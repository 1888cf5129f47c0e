"""Hostile input stays in its place (issue #39, items 1-6; docs/untrusted-data.md).

Each test makes its hostile input by hand (index files, edited manifests, symbolic links, a planted
cache folder) with canary files outside SRC, DST, the dataset and the cache, and checks that the
canaries are unchanged, present and unread (their content in no output, no note), and that the CLI
ends with exit 2 (1 for verify's verdict) and one line naming the file and the rule.
"""
from __future__ import annotations

import json
import os
import tarfile
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest

import pixfeed
from conftest import write_image
from pixfeed import cli
from pixfeed.bench import ceilings
from pixfeed.checksum import file_hash
from pixfeed.datasets import open_dataset
from pixfeed.errors import (CorruptDataError, OutsideDatasetError, OutsideSourceError, OverwriteRefusedError, UnsafeCacheError,
                            UnsafeNameError)
from pixfeed.storage import cache
from pixfeed.storage.chunkcache import ChunkCache
from pixfeed.verify.check import verify

SECRET = b"CANARY-SECRET-0123456789"


def canary(path: Path, data: bytes = SECRET) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def unchanged(path: Path, data: bytes = SECRET) -> bool:
    return path.is_file() and not path.is_symlink() and path.read_bytes() == data


def run(capsys, *argv) -> tuple:
    """(exit code, stdout, stderr) of the pixfeed command line, in this process."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *argv, code: int = 2) -> str:
    """Run a command that must end with ``code`` and one error line, no traceback; return that line."""
    got, out, err = run(capsys, *argv)
    assert got == code, (got, out, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("pixfeed: error: "), err
    assert SECRET.decode() not in out + err
    return lines[0]


@pytest.fixture
def src(tmp_path) -> Path:
    root = tmp_path / "src"
    for i in range(3):
        write_image(root / f"img{i}.jpg", size=(24, 20), seed=i, fmt="JPEG")
    return root


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# 1. a column name, a pack_samples key or a shard member becomes a file name

@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_column_name_that_climbs_out_writes_nothing_outside(capsys, tmp_path, src, kind):
    victim = canary(tmp_path / "outside" / "victim.bin")
    column = "../../outside/victim"  # DST's temp folder/fields/../../outside/victim.bin
    index = tmp_path / f"index.{kind}"
    if kind == "jsonl":
        jsonl(index, [{"path": f"img{i}.jpg", column: f"attacker bytes {i}"} for i in range(3)])
    else:
        index.write_text(f"path,{column}\n" + "".join(f"img{i}.jpg,attacker bytes {i}\n" for i in range(3)))
    line = refused(capsys, "pack", src, tmp_path / "dst", "--index", index, "--format", "mmap", "--size", "8")
    assert "column '../../outside/victim'" in line and "field name" in line and str(index) in line
    assert unchanged(victim) and sorted(p.name for p in victim.parent.iterdir()) == ["victim.bin"]
    assert not (tmp_path / "dst").exists()


def test_a_pack_samples_key_that_climbs_out_is_refused(tmp_path, src):
    victim = canary(tmp_path / "outside" / "victim.bin")
    samples = [{"image": (src / "img0.jpg").read_bytes(), "../../outside/victim": "x"}]
    with pytest.raises(UnsafeNameError, match="key '../../outside/victim' cannot be a field name"):
        pixfeed.pack_samples(samples, tmp_path / "dst", "mmap", size=8)
    assert unchanged(victim) and not (tmp_path / "dst").exists()


def test_a_shard_member_name_off_the_rule_is_refused_before_packing(tmp_path, src):
    shards = tmp_path / "shards"
    shards.mkdir()
    with tarfile.open(shards / "s-000.tar", "w") as tar:
        for name, data in (("k0.jpg", (src / "img0.jpg").read_bytes()), ("k0.my caption.txt", b"hello")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, BytesIO(data))
    with pytest.raises(UnsafeNameError, match="member 'my caption' cannot be a field name"):
        pixfeed.pack(shards, tmp_path / "dst", "mmap", size=8)
    assert not (tmp_path / "dst").exists()


def test_a_column_name_is_checked_for_a_bucket_destination_too(tmp_path, src, bucket, s3_server):
    victim = canary(tmp_path / "outside" / "victim.bin")
    index = jsonl(tmp_path / "index.jsonl", [{"path": "img0.jpg", "../../../../outside/victim": 1}])
    with pytest.raises(UnsafeNameError, match="field name"):
        pixfeed.pack(src, f"{bucket}/ds", "mmap", size=8, index=str(index), storage_options=s3_server.options)
    assert unchanged(victim)
    from pixfeed.storage.store import Store
    assert Store(f"{bucket}/ds", s3_server.options).list() == {}


# 2. bench's file copy

def test_bench_file_copy_names_copies_by_number(tmp_path):
    root, work = tmp_path / "src", tmp_path / "work"
    work.mkdir()
    canary(root / "a.jpg", b"fine")
    canary(tmp_path / "attack" / "v.jpg", b"attacker bytes")
    victim = canary(work / "attack" / "v.jpg")  # where copy-XXX/../attack/v.jpg lands
    ceilings.file_copy(root, ["a.jpg", "../attack/v.jpg"], work)
    assert unchanged(victim) and sorted(p.name for p in work.iterdir()) == ["attack"]


def test_bench_refuses_an_index_row_outside_src(capsys, tmp_path, src):
    canary(tmp_path / "outside.jpg")
    index = jsonl(tmp_path / "index.jsonl", [{"path": "img0.jpg"}, {"path": "../outside.jpg"}])
    line = refused(capsys, "bench", src, "--index", index, "--formats", "mmap", "--out", tmp_path / "report",
                   "-q")
    assert "'../outside.jpg' climbs out of SRC" in line and "--allow-outside-src" in line
    assert unchanged(tmp_path / "outside.jpg")


# 3. --overwrite replaces only what is verifiably a pixfeed dataset

def test_overwrite_refuses_a_folder_whose_manifest_is_not_one(capsys, tmp_path, src):
    dst = tmp_path / "dst"
    canary(dst / "pixfeed.json", b"{}")
    files = [canary(dst / name) for name in ("thesis.tex", "data.bin", "sub/model.pt")]
    line = refused(capsys, "pack", src, dst, "--overwrite", "--size", "8")
    assert "not a valid manifest" in line and "nothing was touched" in line
    assert all(unchanged(f) for f in files)


def test_overwrite_refuses_a_dataset_holding_more_than_its_files(capsys, tmp_path, src):
    dst = tmp_path / "dst"
    pixfeed.pack(src, dst, "mmap", size=8)
    notes = canary(dst / "notes.txt")
    line = refused(capsys, "pack", src, dst, "--overwrite", "--size", "8")
    assert "notes.txt" in line and "does not list" in line
    assert unchanged(notes) and pixfeed.open_dataset(dst)[0][0].shape == (3, 8, 8)
    notes.unlink()
    (dst / "labels.npy").unlink()
    assert "labels.npy" in refused(capsys, "pack", src, dst, "--overwrite", "--size", "8")


def test_overwrite_never_deletes_the_source(capsys, tmp_path, src):
    from pixfeed.packers.replace import check_local

    dst = tmp_path / "dst"
    pixfeed.pack(src, dst, "mmap", size=8)
    images = dst / "images"
    os.rename(src, images)
    before = {p.name: p.read_bytes() for p in images.iterdir()}
    line = refused(capsys, "pack", images, dst, "--overwrite", "--size", "8")
    assert "images" in line and "nothing was touched" in line
    assert {p.name: p.read_bytes() for p in images.iterdir()} == before
    os.rename(images, src)
    with pytest.raises(OverwriteRefusedError, match="holds the source"):  # a whole dataset, but read by the pack
        check_local(dst, [src, dst / "keys.json"])
    check_local(dst, [src])  # and a whole dataset that holds none of the sources may go


def test_a_destination_named_star_removes_nothing_it_did_not_make(tmp_path, src):
    """Other DSTs' leftover names are never matched as a pattern; and a folder under DST's own exact leftover
    name is no proof that pixfeed made it (anyone could name a folder so, or rename one to it): with no
    record of it in the cache, it is left alone (a killed pack's own leftovers are removed:
    test_pack_failures.py)."""
    dead = 4194304 + 4321  # above Linux's largest pid: no such process
    others = [tmp_path / f".other.pixfeed-tmp-{dead}", tmp_path / f".x.pixfeed-old-{dead}",
              tmp_path / f".*.pixfeed-tmp-{dead}"]
    for o in others:
        canary(o / "part.bin")
    pixfeed.pack(src, tmp_path / "*", "mmap", size=8)
    assert all(unchanged(o / "part.bin") for o in others)


# 4. a dataset reads only its own files

@pytest.fixture
def dataset(tmp_path, src) -> Path:
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8)
    return dst


def edit_manifest(root: Path, **changes) -> None:
    m = json.loads((root / "pixfeed.json").read_text())
    m.update(changes)
    (root / "pixfeed.json").write_text(json.dumps(m))


@pytest.mark.parametrize("entry", ["keys_file", "key_index", "shards"])
@pytest.mark.parametrize("where", ["absolute", "climbing"])
def test_manifest_paths_outside_the_dataset_are_refused(capsys, tmp_path, dataset, entry, where):
    secret = canary(tmp_path / "secret.json", json.dumps([SECRET.decode()] * 3).encode())
    name = str(secret) if where == "absolute" else "../secret.json"
    value = {"keys_file": name, "key_index": {"offsets": "keys.offsets.npy", "blob": name},
             "shards": [{"name": name, "count": 3, "bytes": 1, "xxh3_64": "0"}]}[entry]
    edit_manifest(dataset, **{entry: value})
    with pytest.raises(OutsideDatasetError, match="inside the dataset"):
        open_dataset(dataset)
    for command in ("verify", "info"):
        line = refused(capsys, command, dataset)
        assert "must be a relative path inside the dataset" in line
    code, out, err = run(capsys, "pack", dataset, tmp_path / "repack", "--format", "lmdb")
    assert code == 2 and SECRET.decode() not in out + err and not (tmp_path / "repack").exists()
    assert unchanged(secret, json.dumps([SECRET.decode()] * 3).encode())


def test_a_data_file_that_is_a_link_is_refused_unless_allowed(capsys, tmp_path, dataset):
    outside = tmp_path / "outside" / "data.bin"
    outside.parent.mkdir()
    os.rename(dataset / "images.npy", outside)
    (dataset / "images.npy").symlink_to(outside)
    before = outside.read_bytes()
    with pytest.raises(OutsideDatasetError, match="symbolic link.*--allow-links"):
        open_dataset(dataset)
    code, out, err = run(capsys, "verify", dataset)
    assert code == 1 and "Traceback" not in out + err
    assert "images.npy: a symbolic link inside the dataset" in out and "OK" not in out
    assert verify(dataset, allow_links=True).ok
    assert open_dataset(dataset, allow_links=True)[0][0].shape == (3, 8, 8)
    assert outside.read_bytes() == before
    line = refused(capsys, "pack", dataset, tmp_path / "repack", "--format", "lmdb")
    assert "symbolic link" in line
    assert run(capsys, "pack", dataset, tmp_path / "repack", "--format", "lmdb", "--allow-links", "-q")[0] == 0


def test_a_manifest_that_is_a_link_is_refused(capsys, tmp_path, dataset):
    os.rename(dataset / "pixfeed.json", tmp_path / "elsewhere.json")
    (dataset / "pixfeed.json").symlink_to(tmp_path / "elsewhere.json")
    assert "the manifest is a symbolic link" in refused(capsys, "verify", dataset)
    with pytest.raises(OutsideDatasetError):
        open_dataset(dataset)


def _rehash(root: Path, name: str) -> None:
    m = json.loads((root / "pixfeed.json").read_text())
    m["files"][name] = {"bytes": (root / name).stat().st_size, "xxh3_64": file_hash(root / name)}
    m.pop("chunks", None)
    (root / "pixfeed.json").write_text(json.dumps(m))


@pytest.mark.parametrize("how", ["external link", "external storage"])
def test_hdf5_reading_another_file_is_refused(capsys, tmp_path, src, how):
    h5py = pytest.importorskip("h5py")
    ds = tmp_path / "ds"
    pixfeed.pack(src, ds, "hdf5", store="encoded")
    secret = canary(tmp_path / "secret.bin", SECRET * 4)
    with h5py.File(ds / "data.h5", "a") as f:
        if how == "external link":
            with h5py.File(tmp_path / "other.h5", "w") as o:
                o["x"] = np.frombuffer(SECRET, np.uint8)
            f["leak"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/x")
        else:
            f.create_dataset("leak", shape=(len(SECRET),), dtype="u1", external=[(str(secret), 0, len(SECRET))])
    _rehash(ds, "data.h5")
    with pytest.raises(OutsideDatasetError, match="outside the dataset"):
        open_dataset(ds)[0]
    code, out, err = run(capsys, "verify", ds)
    assert code == 1 and "outside the dataset" in out and "Traceback" not in out + err
    assert SECRET.decode() not in out + err
    assert open_dataset(ds, allow_links=True)[0][0].shape[0] == 3
    assert unchanged(secret, SECRET * 4)


# 5. index paths stay in SRC

@pytest.mark.parametrize("where", ["climbing", "absolute"])
def test_index_paths_outside_src_are_refused_and_never_read(capsys, tmp_path, src, where):
    outside = write_image(tmp_path / "outside" / "canary.jpg", size=(24, 20), seed=9, fmt="JPEG")
    before = outside.read_bytes()
    path = "../outside/canary.jpg" if where == "climbing" else str(outside)
    index = jsonl(tmp_path / "index.jsonl", [{"path": "img0.jpg"}, {"path": path}])
    line = refused(capsys, "pack", src, tmp_path / "dst", "--index", index, "--size", "8")
    assert "line 2" in line and "--allow-outside-src" in line and str(index) in line
    assert not (tmp_path / "dst").exists()
    # skipped under --on-error skip: the note says why, the same whether the file exists or not
    missing = path.replace("canary", "nothing")
    jsonl(index, [{"path": "img0.jpg"}, {"path": path}, {"path": missing}])
    assert run(capsys, "pack", src, tmp_path / "dst", "--index", index, "--size", "8", "--on-error", "skip",
               "-q")[0] == 0
    m = json.loads((tmp_path / "dst" / "pixfeed.json").read_text())
    assert m["count"] == 1 and len(m["skipped"]) == 2
    reasons = [s["reason"] for s in m["skipped"]]
    assert reasons[1] == reasons[0].replace("canary", "nothing").replace("line 2", "line 3")
    assert "--allow-outside-src" in reasons[0]
    assert m["stats"]["source_bytes"] == (src / "img0.jpg").stat().st_size
    # the Hugging Face case: asked for, they are read
    m = pixfeed.pack(src, tmp_path / "hf", "mmap", size=8, index=str(index), on_error="skip", allow_outside_src=True)
    assert m["count"] == 2
    assert outside.read_bytes() == before


def test_mask_paths_outside_src_are_refused(tmp_path, src):
    outside = tmp_path / "outside" / "mask.png"
    write_image(outside, size=(24, 20), mode="L", fmt="PNG")
    index = jsonl(tmp_path / "index.jsonl", [{"path": f"img{i}.jpg", "mask": "../outside/mask.png"} for i in range(2)])
    with pytest.raises(OutsideSourceError, match="line 1, column .mask.: .*climbs out of SRC"):
        pixfeed.pack(src, tmp_path / "dst", "mmap", size=8, index=str(index), field=["mask:mask"])
    assert not (tmp_path / "dst").exists()


def test_a_note_never_quotes_a_file(tmp_path, src):
    (src / "img1.jpg").write_bytes(SECRET + b"\n")
    m = pixfeed.pack(src, tmp_path / "dst", "lmdb", on_error="skip")
    assert len(m["skipped"]) == 1 and "plain text" in m["skipped"][0]["reason"]
    assert SECRET.decode()[:8] not in (tmp_path / "dst" / "pixfeed.json").read_text()


# 6. the node-local cache of bucket datasets is the user's alone

@pytest.fixture
def remote(tmp_path_factory, bucket, s3_server):
    src = tmp_path_factory.mktemp("remote-src")
    for i in range(3):
        write_image(src / f"img{i}.jpg", size=(24, 20), seed=i, fmt="JPEG")
    pixfeed.pack(src, f"{bucket}/ds", "mmap", size=8, storage_options=s3_server.options)
    return f"{bucket}/ds", s3_server.options


def copy_folder(url: str, so: dict, base: Path, manifest=None) -> Path:
    """Where ``cache.stage`` keeps its copy of ``url`` (the same name: the test plants it first)."""
    import xxhash

    from pixfeed.manifest import read_manifest
    from pixfeed.storage.store import Store

    manifest = manifest or read_manifest(url, so)
    store = Store(url, so)
    key = xxhash.xxh3_64_hexdigest((store.url + "\0" + json.dumps(manifest, sort_keys=True)).encode())
    return base / f"{store.url.rsplit('/', 1)[-1]}-{key}"


def test_a_cache_folder_others_can_write_is_refused(tmp_path, remote):
    url, so = remote
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafeCacheError, match="writable by others"):
        open_dataset(url, storage_options=so, cache_dir=shared)
    assert list(shared.iterdir()) == []
    fresh = tmp_path / "fresh" / "cache"
    assert open_dataset(url, storage_options=so, cache_dir=fresh)[0][0].shape == (3, 8, 8)
    assert (os.stat(fresh).st_mode & 0o777) == 0o700
    assert all(os.stat(p).st_mode & 0o077 == 0 for p in fresh.iterdir() if p.is_dir())


def test_planted_data_is_checked_and_replaced(tmp_path, remote):
    url, so = remote
    base = tmp_path / "cache"
    good = open_dataset(url, storage_options=so, cache_dir=base)
    want = [good[i][0].numpy().tobytes() for i in range(3)]
    folder = copy_folder(url, so, base)
    # the same sizes, other bytes: stored pixels and their checksums, rewritten to agree
    planted = np.load(folder / "images.npy")
    planted[:] = 7
    np.save(folder / "images.npy", planted)
    from pixfeed.checksum import record_hash
    np.save(folder / "checksums.npy", np.array([record_hash(r) for r in planted], np.uint64))
    cache._HELD.clear()
    again = open_dataset(url, storage_options=so, cache_dir=base)
    # checksums.npy failed the manifest's xxh3_64 and was fetched again; the planted pixels fail it
    with pytest.raises(CorruptDataError, match="checksum"):
        again[0]
    assert np.array_equal(np.load(folder / "checksums.npy"), np.load(folder / "checksums.npy"))
    (folder / "images.npy").unlink()  # a file gone from a copy is fetched again
    cache._HELD.clear()
    again = open_dataset(url, storage_options=so, cache_dir=base)
    assert [again[i][0].numpy().tobytes() for i in range(3)] == want


@pytest.mark.parametrize("plant", ["copy folder", "lock", "part"])
def test_planted_links_in_the_cache_write_nothing_outside(tmp_path, remote, plant):
    url, so = remote
    base = tmp_path / "cache"
    base.mkdir(mode=0o700)
    victim = canary(tmp_path / "outside" / "victim.bin")
    target = tmp_path / "outside"
    folder = copy_folder(url, so, base)
    if plant == "copy folder":
        folder.symlink_to(target)
    elif plant == "lock":
        folder.with_name(folder.name + ".lock").symlink_to(victim)
    else:
        folder.mkdir(mode=0o700)
        (folder / "images.npy.part").symlink_to(victim)
    with pytest.raises(UnsafeCacheError, match="symbolic link"):
        open_dataset(url, storage_options=so, cache_dir=base)
    assert unchanged(victim) and sorted(p.name for p in target.iterdir()) == ["victim.bin"]


def test_eviction_never_follows_a_planted_link(tmp_path, remote):
    url, so = remote
    base = tmp_path / "cache"
    open_dataset(url, storage_options=so, cache_dir=base)
    other = tmp_path / "someone-else"
    other.mkdir()
    manifest = canary(other / "pixfeed.json")
    (base / "planted").symlink_to(other)
    cache._HELD.clear()
    cache.evict(base, 0)
    assert unchanged(manifest)


def test_a_chunks_folder_that_is_a_link_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "copy"
    folder.mkdir(mode=0o700)
    (folder / "chunks").symlink_to(outside)
    with pytest.raises(UnsafeCacheError, match="symbolic link"):
        ChunkCache(None, "data.bin", 100, folder, 10, 100)
    assert list(outside.iterdir()) == []
