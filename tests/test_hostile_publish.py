"""Hostile input, second pass (#43 items 1-5, 16): pixfeed deletes only what it can prove it made, publishes
a pack in one step, reserves disk by what is really there, checks the file it opened rather than the path
it looked at, and escapes every character of input it prints (docs/untrusted-data.md)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pixfeed
from conftest import make_tree
from pixfeed import cli
from pixfeed.errors import DestinationChangedError, NotOursError, OptionError, OverwriteRefusedError
from pixfeed.packers import pipeline, replace
from pixfeed.storage.store import Store
from pixfeed.verify.check import verify


@pytest.fixture
def src(tmp_path) -> Path:
    return make_tree(tmp_path / "src", per_class=2)


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list:
    return sorted(p.name for p in parent.iterdir() if ".pixfeed-" in p.name)


def run_child(code: str, env: dict = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python (this test's cache: PIXFEED_CACHE is inherited)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def during_the_pack(monkeypatch, action) -> None:
    """Run ``action()`` while the pack runs: after its records are written, before its manifest."""
    real = pipeline.write_manifest

    def write_manifest(root, manifest):
        action()
        real(root, manifest)
    monkeypatch.setattr(pipeline, "write_manifest", write_manifest)


# ---- 2. whatever appears at DST while the pack runs is left alone ---------------------------------------

def test_a_folder_that_appears_at_dst_during_the_pack_is_left_alone(tmp_path, src, monkeypatch):
    dst = tmp_path / "ds"
    during_the_pack(monkeypatch, lambda: (dst.mkdir(), (dst / "notes.txt").write_text("mine")))
    with pytest.raises(DestinationChangedError, match="appeared while the pack ran"):
        pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    assert snapshot(dst) == {"notes.txt": b"mine"} and leftovers(tmp_path) == []


@pytest.mark.parametrize("what", ["empty folder", "file", "link"])
def test_anything_that_appears_at_dst_during_the_pack_is_left_alone(tmp_path, src, monkeypatch, what):
    """An empty folder too: a plain rename over it would have replaced it silently."""
    dst = tmp_path / "ds"
    make = {"empty folder": dst.mkdir, "file": lambda: dst.write_text("mine"),
            "link": lambda: dst.symlink_to(src)}[what]
    during_the_pack(monkeypatch, make)
    with pytest.raises(DestinationChangedError):
        pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    assert os.path.lexists(dst) and leftovers(tmp_path) == []
    assert (dst.is_symlink() if what == "link" else dst.is_dir() if what == "empty folder" else
            dst.read_text() == "mine")


def test_overwrite_checks_dst_again_when_it_publishes(tmp_path, src, monkeypatch):
    """--overwrite checked a whole dataset when the pack started; a file added meanwhile makes it no longer
    one, and it is refused then, untouched."""
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    during_the_pack(monkeypatch, lambda: (dst / "notes.txt").write_text("mine"))
    with pytest.raises(OverwriteRefusedError, match="notes.txt"):
        pixfeed.pack(src, dst, "mmap", size=12, workers=1, overwrite=True)
    assert (dst / "notes.txt").read_text() == "mine" and json.loads((dst / "pixfeed.json").read_text())["shape"][0] == 8
    assert leftovers(tmp_path) == []


def test_the_cli_names_the_rule_in_one_line(tmp_path, src, monkeypatch, capsys):
    dst = tmp_path / "ds"
    during_the_pack(monkeypatch, dst.mkdir)
    assert cli.main(["pack", str(src), str(dst), "--size", "8", "--workers", "1", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "appeared while the pack ran" in err[0], err


# ---- 3. publishing in one step; a kill between two renames loses nothing ----------------------------------

CHILD_PACK = """
    import os, signal, sys
    from pixfeed.packers import pack, replace
    {patch}
    pack(sys.argv[1], sys.argv[2], "mmap", size=12, workers=1, overwrite=True)
"""


def kill_during_publish(src: Path, dst: Path, patch: str) -> None:
    code = textwrap.dedent(CHILD_PACK).format(patch=textwrap.dedent(patch).strip())
    r = subprocess.run([sys.executable, "-c", code, str(src), str(dst)], capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, (r.returncode, r.stderr)


def test_a_kill_between_the_two_renames_of_a_fallback_publish_loses_nothing(tmp_path, src):
    """Where the file system has no exchange, the old dataset is moved aside first; a SIGKILL right then
    leaves no DST: the next pack puts the old dataset back (it is the only copy), never deletes it."""
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    before = snapshot(dst)
    kill_during_publish(src, dst, """
        replace._renameat2 = lambda a, b, flags: False  # a file system without renameat2
        real = os.rename
        def rename(a, b):
            real(a, b)
            if ".pixfeed-old-" in str(b):
                os.kill(os.getpid(), signal.SIGKILL)
        os.rename = rename
    """)
    assert not dst.exists() and any("pixfeed-old" in n for n in leftovers(tmp_path))
    with pytest.raises(OptionError, match="exists; pass --overwrite"):  # put back first, so DST exists again
        pixfeed.pack(src, dst, "mmap", size=16, workers=1)
    assert snapshot(dst) == before and verify(dst).ok and leftovers(tmp_path) == []


KILLED_AFTER_EXCHANGE = """
    def remove(path, st):  # the old dataset is about to be removed, from under the pack's temporary name
        os.kill(os.getpid(), signal.SIGKILL)
    replace._remove = remove
"""


def test_a_kill_after_the_exchange_leaves_the_new_dataset_and_the_next_pack_clears_the_old(tmp_path, src):
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    kill_during_publish(src, dst, KILLED_AFTER_EXCHANGE)
    assert json.loads((dst / "pixfeed.json").read_text())["shape"][0] == 12 and verify(dst).ok
    assert len(leftovers(tmp_path)) == 1  # the old dataset, under the pack's temporary name
    pixfeed.pack(src, tmp_path / "other", "mmap", size=8, workers=1)  # another DST: this one's leftovers stay
    assert len(leftovers(tmp_path)) == 1
    pixfeed.pack(src, dst, "mmap", size=16, workers=1, overwrite=True)
    assert leftovers(tmp_path) == [] and verify(dst).ok


def test_publish_exchanges_in_one_step_where_the_file_system_can(tmp_path, src, monkeypatch):
    """The replaced dataset never leaves DST empty: DST is not renamed aside where renameat2 exchanges."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    if not replace._renameat2(tmp_path / "a", tmp_path / "b", replace._EXCHANGE):
        pytest.skip("this file system has no renameat2(RENAME_EXCHANGE); the fallback is tested above")
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    renamed = []
    monkeypatch.setattr(replace.os, "rename", lambda a, b: renamed.append((a, b)) or os.replace(a, b))
    pixfeed.pack(src, dst, "mmap", size=12, workers=1, overwrite=True)
    assert renamed == [] and verify(dst).ok and leftovers(tmp_path) == []


def test_a_planted_leftover_named_like_a_killed_pack_is_not_deleted(tmp_path, src):
    """A folder renamed to .DST.pixfeed-tmp-PID (a dead pid) is no proof that pixfeed made it."""
    dead = 4194304 + 4321
    planted = tmp_path / f".ds.pixfeed-tmp-{dead}"
    planted.mkdir()
    (planted / "thesis.tex").write_text("mine")
    old = tmp_path / f".ds.pixfeed-old-{dead}"
    old.mkdir()
    (old / "pixfeed.json").write_text("{}")
    pixfeed.pack(src, tmp_path / "ds", "mmap", size=8, workers=1)
    assert (planted / "thesis.tex").read_text() == "mine" and (old / "pixfeed.json").read_text() == "{}"


def test_a_leftover_swapped_after_the_kill_is_not_deleted(tmp_path, src):
    """The record names the folder pixfeed made by its inode: another folder moved to the same name stays."""
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    kill_during_publish(src, dst, KILLED_AFTER_EXCHANGE)
    [name] = leftovers(tmp_path)
    os.rename(tmp_path / name, tmp_path / "moved-away")
    (tmp_path / name).mkdir()
    (tmp_path / name / "thesis.tex").write_text("mine")
    pixfeed.pack(src, dst, "mmap", size=16, workers=1, overwrite=True)
    assert (tmp_path / name / "thesis.tex").read_text() == "mine"


# ---- 1. a bucket marker authorises nothing --------------------------------------------------------------

def test_a_planted_marker_does_not_wipe_a_shared_prefix(src, bucket, s3_server):
    so, url = s3_server.options, f"{bucket}/shared"
    store = Store(url, so)
    store.write(".pixfeed-packing", json.dumps({"pixfeed_pack": "0" * 32}).encode())
    store.write("alice/results.csv", b"a,b\n")
    store.write("bob/model.pt", b"weights")
    before = store.list()
    for overwrite in (False, True):
        with pytest.raises(NotOursError, match="nothing was touched"):
            pixfeed.pack(src, url, "mmap", size=8, storage_options=so, overwrite=overwrite)
        assert store.list() == before


def test_a_marker_beside_a_dataset_is_no_licence_either(src, bucket, s3_server):
    so, url = s3_server.options, f"{bucket}/ds"
    m = pixfeed.pack(src, url, "mmap", size=8, storage_options=so)
    store = Store(url, so)
    store.write(".pixfeed-packing", b"x" * 10000)  # too long to name a pack: read no further
    before = store.list()
    with pytest.raises(NotOursError):
        pixfeed.pack(src, url, "mmap", size=8, storage_options=so, overwrite=True)
    assert store.list() == before and set(m["files"]) < set(before)


BUCKET_CHILD = """
    import json, os, signal, sys
    from pixfeed.packers import pack, upload
    def commit(self, tmp, manifest):
        self.send(tmp, list(manifest["files"])[:2])
        self._wait()
        os.kill(os.getpid(), signal.SIGKILL)  # killed with two files uploaded, before its manifest
    upload.Upload.commit = commit
    pack(sys.argv[1], sys.argv[2], "wds", shard_size=2, workers=1, storage_options=json.loads(sys.argv[3]))
"""


def test_a_pack_killed_midway_is_cleared_by_the_next_one_exactly(src, bucket, s3_server):
    so, url = s3_server.options, f"{bucket}/ds"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(BUCKET_CHILD), str(src), url, json.dumps(so)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    store = Store(url, so)
    left = store.list()
    assert ".pixfeed-packing" in left and "pixfeed.json" not in left and len(left) > 1
    store.write("carol/notes.txt", b"mine")  # someone else's object beside the leftovers: nothing is deleted
    with pytest.raises(NotOursError, match="carol/notes.txt"):
        pixfeed.pack(src, url, "wds", shard_size=4, storage_options=so)
    assert store.list() == {**left, "carol/notes.txt": 4}
    store.remove(["carol/notes.txt"])
    m = pixfeed.pack(src, url, "wds", shard_size=4, storage_options=so)  # its own leftovers: cleared
    assert sorted(store.list()) == sorted([*m["files"], "pixfeed.json"])


def test_objects_that_appear_under_dst_during_a_bucket_pack_are_left_alone(src, bucket, s3_server, monkeypatch):
    so, url = s3_server.options, f"{bucket}/ds"
    store = Store(url, so)
    during_the_pack(monkeypatch, lambda: store.write("dave/plot.png", b"png"))
    with pytest.raises(DestinationChangedError, match="dave/plot.png"):
        pixfeed.pack(src, url, "mmap", size=8, storage_options=so)
    assert store.list() == {"dave/plot.png": 3}


# ---- 16. input's newlines are escaped like any control character ------------------------------------------

FORGED = "dog\nchecksum  xxh3_64 (verified OK by pixfeed verify)"


def test_info_escapes_newlines_in_class_names_and_skipped_files(tmp_path, src, capsys):
    os.rename(src / "dog", src / FORGED)
    (src / "cat" / "bad\nrecords  0 (verified OK).jpg").write_bytes(b"not an image")
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1, on_error="skip")
    assert cli.main(["info", str(dst)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert not any(line.startswith(("checksum  xxh3_64 (verified", "records  0")) for line in lines), out
    assert "dog\\nchecksum" in out and "bad\\nrecords" in out
    assert [line.split()[0] for line in lines if not line.startswith(" ")] == \
        ["format", "records", "store", "classes", "files", "checksum", "fields", "source", "skipped", "created"]


def test_info_json_escapes_c1_controls_and_bidi_overrides(tmp_path, src, capsys):
    os.rename(src / "dog", src / "dog\x9b2J\u202eevil")
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    assert cli.main(["info", "--json", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "\x9b" not in out and "\u202e" not in out and "\\u009b2J\\u202eevil" in out
    assert "dog\x9b2J\u202eevil" in json.loads(out)["classes"]


# ---- 5. verify reads the file it checked: a link swapped in is refused, never followed ----------------------

@pytest.mark.parametrize("name", ["keys.json", "images.npy", "pixfeed.json"])
def test_a_link_swapped_in_during_verify_is_not_followed(tmp_path, src, monkeypatch, name):
    """The swap comes right after pixfeed first looks at the file (lstat) or right before it opens it,
    whichever is first: a check of the path followed by an open of the path read the outside file."""
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    outside = tmp_path / "secret"
    size = (dst / name).stat().st_size  # the same size: only its bytes tell it from the dataset's own
    outside.write_bytes((dst / name).read_bytes() if name == "pixfeed.json" else b"[" + b" " * (size - 2) + b"]")
    swapped = []

    def swap():
        if not swapped:
            swapped.append(True)
            os.unlink(dst / name)
            os.symlink(outside, dst / name)

    real_lstat, real_open, reads = os.lstat, os.open, []

    def lstat(path, *a, **kw):
        out = real_lstat(path, *a, **kw)
        if str(path).endswith(name):
            swap()
        return out

    def open_(path, flags, *a, **kw):
        if str(path).endswith(name):
            swap()
        fd = real_open(path, flags, *a, **kw)
        if os.path.samefile(f"/proc/self/fd/{fd}", outside):
            reads.append(path)
        return fd
    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "open", open_)
    try:
        report = verify(dst)
    except pixfeed.errors.DatasetError as e:  # the manifest itself: refused as a whole
        report = None
        assert name == "pixfeed.json" and "symbolic link" in str(e)
    monkeypatch.undo()
    assert swapped and reads == [], reads
    if report is not None:  # each problem with the file is the link, none what reading the outside file found
        about = [p for p in report.problems if f"/{name}" in p]
        assert about and all("symbolic link" in p for p in about), report.problems


def test_verify_of_a_dataset_whose_files_are_fifos_and_folders_names_each(tmp_path, src, capsys):
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    os.unlink(dst / "keys.json")
    os.mkfifo(dst / "keys.json")
    os.unlink(dst / "labels.npy")
    (dst / "labels.npy").mkdir()
    assert cli.main(["verify", "-q", str(dst)]) == 1
    out = capsys.readouterr().out
    assert "keys.json: is a FIFO" in out and "labels.npy" in out and "Traceback" not in out


# ---- 4. disk is reserved by what is really there, and never past the file system's free space -----------------

@pytest.fixture
def reserved(monkeypatch) -> list:
    """The sizes posix_fallocate is asked for (in this process and forked workers), none granted past 64 MiB:
    a test must not fill the machine's disk if the rule breaks."""
    asked, real = [], os.posix_fallocate

    def fallocate(fd, offset, length):
        asked.append(length)
        if length > 64 << 20:
            raise OSError(28, "No space left on device (test: refused to reserve what input claims)")
        real(fd, offset, length)
    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    return asked


def test_a_repack_checks_the_offsets_against_the_data_file_before_reserving(tmp_path, src, reserved):
    import numpy as np

    old = tmp_path / "old"
    pixfeed.pack(src, old, "mmap", store="encoded", workers=1)
    offsets = np.load(old / "offsets.npy")
    offsets[-1] = 100 << 30  # 100 GiB claimed for a data.bin of a few KB
    np.save(old / "offsets.npy", offsets)
    reserved.clear()
    with pytest.raises(pixfeed.errors.CorruptDataError, match=r"data.bin|offsets"):
        pixfeed.pack(old, tmp_path / "new", "mmap", workers=1)
    assert max(reserved, default=0) < 1 << 20 and leftovers(tmp_path) == [] and not (tmp_path / "new").exists()


@pytest.mark.parametrize("fmt", ["mmap", "wds"])
def test_sparse_source_files_reserve_only_the_blocks_they_hold(tmp_path, src, reserved, fmt):
    for i in range(4):
        with open(src / "cat" / f"sparse{i}.jpg", "wb") as f:
            f.truncate(48 << 20)  # 48 MiB by st_size, no block on disk
    m = pixfeed.pack(src, tmp_path / "ds", fmt, store="encoded", workers=1, on_error="skip")
    assert len(m["skipped"]) == 4 and max(reserved) < 8 << 20, reserved


def test_a_reservation_past_the_free_space_is_refused_before_anything_is_written(tmp_path, src, monkeypatch,
                                                                                capsys):
    """A small file system: 1 MiB free of 100 MiB.  The pixels of 6 images at 256x256 (1.2 MB) do not fit."""
    monkeypatch.setattr(os, "fstatvfs", lambda fd: os.statvfs_result((4096, 4096, 25600, 256, 256, 0, 0, 0, 0, 255)))
    assert cli.main(["pack", str(src), str(tmp_path / "ds"), "--size", "256", "--workers", "1", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "nothing was reserved" in err[0], err
    assert not (tmp_path / "ds").exists() and leftovers(tmp_path) == []


# ---- siblings of 1: other marks that must not choose what is deleted --------------------------------------

def test_a_sample_mark_naming_files_outside_its_folder_deletes_none_of_them(tmp_path):
    """`pixfeed sample --overwrite` removes the files a sample wrote, as listed in its mark: the files found in
    the folder, never a path the mark's text names (``../victim.txt``), nor through a link."""
    from pixfeed.sample import MARK, claim_folder

    root = tmp_path / "sample"
    assert cli.main(["sample", str(root), "--count", "3", "-q"]) == 0
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "thesis.tex").write_text("mine")
    with open(root / MARK, "a", encoding="utf-8") as f:
        f.write("../victim.txt\n")
    claim_folder(root, overwrite=True)
    assert victim.read_text() == "mine" and not any(root.iterdir())
    assert cli.main(["sample", str(root), "--count", "3", "-q"]) == 0
    (root / "linked").symlink_to(elsewhere)
    with open(root / MARK, "a", encoding="utf-8") as f:
        f.write("linked\nlinked/thesis.tex\n")
    claim_folder(root, overwrite=True)
    assert (elsewhere / "thesis.tex").read_text() == "mine" and not (root / "linked").exists()


def test_table_cells_and_warnings_escape_newlines_from_input():
    """Siblings of info's forged line: a report table (doctor, bench) and a warning quoting a name."""
    import warnings

    from pixfeed.console.texttable import table
    from pixfeed.console.warn import warn_caller

    lines = "\n".join(table(["check", "value"], [["dataset", f"/data/{FORGED}"], ["disk", "ok"]])).splitlines()
    assert len(lines) == 4 and not any(line.startswith("checksum") for line in lines)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_caller(f"pixfeed: /data/{FORGED}: each rank reads 1 shard(s)")
    assert "\n" not in str(caught[0].message) and "dog\\nchecksum" in str(caught[0].message)


@pytest.mark.parametrize("name", ["keys.utf8", "keys.offsets.npy"])
@pytest.mark.parametrize("how", ["key", "keys"])
def test_a_reader_opens_its_key_files_without_following_a_link_swapped_in_after_it_opened(tmp_path, src, name,
                                                                                        how):
    """open_dataset checked the folder for links; a link swapped in after that is refused when the key index
    is read (a lookup, or every key for a repack), never followed to the file it names."""
    from pixfeed.datasets import open_dataset

    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, "mmap", size=8, workers=1)
    ds = open_dataset(dst)
    outside = tmp_path / "outside"
    outside.write_bytes((dst / name).read_bytes())
    os.unlink(dst / name)
    os.symlink(outside, dst / name)
    with pytest.raises(pixfeed.errors.OutsideDatasetError, match="symbolic link"):
        ds.key(0) if how == "key" else ds.keys()


def test_a_pack_goes_on_where_the_cache_cannot_hold_its_record(tmp_path, src, monkeypatch, caplog):
    """A cache others may write (or none at all) keeps no record: the pack still publishes, says once that a
    killed pack's leftovers would be the user's to remove, and leaves nothing behind."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o777)
    os.chmod(cache, 0o777)
    monkeypatch.setenv("PIXFEED_CACHE", str(cache))
    m = pixfeed.pack(src, tmp_path / "ds", "mmap", size=8, workers=1)
    assert m["count"] == 6 and verify(tmp_path / "ds").ok and leftovers(tmp_path) == []
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "cannot keep the record" in caplog.records[0].message and not (cache / "packs").exists()


def test_overwrite_reads_a_bucket_manifest_no_further_than_its_limit(src, bucket, s3_server, monkeypatch):
    """--overwrite checks the manifest under DST: a huge one is refused after at most one byte past the limit."""
    from pixfeed.storage import bounded

    so, url = s3_server.options, f"{bucket}/ds"
    store = Store(url, so)
    store.write("pixfeed.json", b"{" + b" " * 3000 + b"}")
    monkeypatch.setattr(bounded, "MANIFEST_BYTES", 1000)
    monkeypatch.setattr(pixfeed.packers.upload, "MANIFEST_BYTES", 1000, raising=False)
    fetched = []
    real = Store.read_range
    monkeypatch.setattr(Store, "read_range", lambda self, n, a, b: fetched.append(b - a) or real(self, n, a, b))
    monkeypatch.setattr(Store, "read", lambda self, n: pytest.fail(f"{n} read whole"))
    with pytest.raises(pixfeed.errors.OverLimitError, match="pixfeed.json"):
        pixfeed.pack(src, url, "mmap", size=8, storage_options=so, overwrite=True)
    assert max(fetched) <= 1001 and store.list() == {"pixfeed.json": 3002}


def test_overwrite_reads_a_local_manifest_within_its_limit_and_never_a_fifo(tmp_path, src, monkeypatch):
    from pixfeed.storage import bounded

    dst = tmp_path / "ds"
    dst.mkdir()
    (dst / "pixfeed.json").write_bytes(b"{" + b" " * 3000 + b"}")
    monkeypatch.setattr(replace, "MANIFEST_BYTES", 1000)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} read whole"))
    with pytest.raises(OverwriteRefusedError, match="not a pixfeed dataset"):
        pixfeed.pack(src, dst, "mmap", size=8, workers=1, overwrite=True)
    os.unlink(dst / "pixfeed.json")
    os.mkfifo(dst / "pixfeed.json")  # would block a read for ever
    with pytest.raises(OverwriteRefusedError):
        pixfeed.pack(src, dst, "mmap", size=8, workers=1, overwrite=True)
    assert sorted(p.name for p in dst.iterdir()) == ["pixfeed.json"] and bounded.MANIFEST_BYTES > 1000


def test_a_pack_killed_after_its_manifest_leaves_a_dataset_that_stands(src, bucket, s3_server):
    """Killed between its manifest and the marker's removal: the dataset is whole, so the next pack removes only
    the marker (its record proves it) and, without --overwrite, leaves the dataset as it is."""
    so, url = s3_server.options, f"{bucket}/ds"
    code = BUCKET_CHILD.replace('''        self.send(tmp, list(manifest["files"])[:2])
        self._wait()
        os.kill''', '''        real_remove = self.store.remove
        self.store.remove = lambda names: os.kill(os.getpid(), signal.SIGKILL) if ".pixfeed-packing" in names \\
            else real_remove(names)
        real_commit(self, tmp, manifest)
        os.kill''').replace("    def commit(", "    real_commit = upload.Upload.commit\n    def commit(")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(src), url, json.dumps(so)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    store = Store(url, so)
    left = store.list()
    assert ".pixfeed-packing" in left and "pixfeed.json" in left
    with pytest.raises(OptionError, match="--overwrite"):
        pixfeed.pack(src, url, "wds", shard_size=4, storage_options=so)
    assert store.list() == {k: v for k, v in left.items() if k != ".pixfeed-packing"}
    assert verify(url, storage_options=so).ok


def swap_for_link(dst: Path, name: str, outside: Path) -> None:
    """``dst/name`` replaced by a symbolic link to a byte-for-byte copy of it at ``outside``."""
    outside.write_bytes((dst / name).read_bytes())
    os.unlink(dst / name)
    os.symlink(outside, dst / name)


DATA_FILES = [("mmap", "pixels", "images.npy", True), ("mmap", "pixels", "images.npy", False),
              ("mmap", "pixels", "labels.npy", True), ("mmap", "pixels", "checksums.npy", True),
              ("mmap", "encoded", "data.bin", True), ("mmap", "encoded", "data.bin", False),
              ("mmap", "encoded", "offsets.npy", True), ("lmdb", "pixels", "data.mdb", True),
              ("hdf5", "pixels", "data.h5", True), ("wds", "encoded", None, True)]


def first_sample(ds):
    return next(iter(ds)) if ds.format == "wds" else ds[0]


@pytest.mark.parametrize("fmt,store,name,mapped", DATA_FILES)
def test_a_reader_opens_its_data_files_without_following_a_link_swapped_in_after_it_opened(
        tmp_path, src, monkeypatch, fmt, store, name, mapped):
    """open_dataset checked the folder for links; a data file swapped for a link (to a faithful copy outside)
    after that is refused when the reader first opens it, in every format and either way the mmap reader reads
    (mapped, or pread when the dataset does not fit in the page cache), never followed; allow_links reads it."""
    from pixfeed.datasets import mmap as mmap_reader, open_dataset

    monkeypatch.setattr(mmap_reader, "fits_in_page_cache", lambda size: mapped)
    dst = tmp_path / "ds"
    pixfeed.pack(src, dst, fmt, store=store, workers=1, **({"size": 8} if store == "pixels" else {}))
    name = name or json.loads((dst / "pixfeed.json").read_text())["shards"][0]["name"]
    ds = open_dataset(dst, shuffle=False) if fmt == "wds" else open_dataset(dst)
    expected = first_sample(open_dataset(dst, shuffle=False) if fmt == "wds" else open_dataset(dst))
    swap_for_link(dst, name, tmp_path / "outside")
    with pytest.raises(pixfeed.errors.OutsideDatasetError, match="symbolic link"):
        first_sample(ds)
    options = {"shuffle": False} if fmt == "wds" else {}
    image, label = first_sample(open_dataset(dst, allow_links=True, **options))
    assert label == expected[1] and (image == expected[0]).all()


@pytest.mark.parametrize("which", ["data", "whole"])
def test_read_ahead_never_waits_on_a_fifo_swapped_in_for_a_data_file(tmp_path, which):
    """The read-ahead thread opens the files it hints about as the readers do: a FIFO in place of the data
    file (or of labels.npy, hinted whole) is refused at once, not opened and waited on for ever."""
    import numpy as np

    from pixfeed.loaders.readahead import _Requests
    from pixfeed.storage.pagecache import Extents

    fifo, data = tmp_path / "fifo", tmp_path / "data.bin"
    os.mkfifo(fifo)
    data.write_bytes(b"x" * 64)
    extents = Extents(fifo if which == "data" else data, np.zeros(4, np.int64), np.ones(4, np.int64),
                      whole=[fifo] if which == "whole" else [])
    hints = _Requests(extents, np.arange(4), 1 << 20, None)
    hints.start()
    hints.join(timeout=60)
    assert not hints.is_alive()


def test_a_repack_sizes_its_reservation_by_the_data_file_it_opened_not_a_link_swapped_in(tmp_path, src, reserved,
                                                                                          monkeypatch):
    """offsets.npy claims 32 MiB for a record of a few KB and data.bin is swapped, after the source was opened
    and its labels read, for a link to a 32 MiB file outside: the repack refuses the link before it reserves
    what the outside file's size would have let the offsets claim."""
    import numpy as np

    from pixfeed.packers import fromdataset

    old = tmp_path / "old"
    pixfeed.pack(src, old, "mmap", store="encoded", workers=1)
    offsets = np.load(old / "offsets.npy")
    offsets[-1] = 32 << 20
    np.save(old / "offsets.npy", offsets)
    with open(tmp_path / "outside", "wb") as f:
        f.truncate(32 << 20)
    real = fromdataset._sizes

    def swap_then_read(*args):
        os.unlink(old / "data.bin")
        os.symlink(tmp_path / "outside", old / "data.bin")
        return real(*args)
    monkeypatch.setattr(fromdataset, "_sizes", swap_then_read)
    reserved.clear()
    with pytest.raises(pixfeed.errors.OutsideDatasetError, match="symbolic link"):
        pixfeed.pack(old, tmp_path / "new", "mmap", workers=1)
    assert max(reserved, default=0) < 1 << 20 and not (tmp_path / "new").exists()


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_doctor_s_storage_check_refuses_a_data_file_that_is_a_device_or_fifo(tmp_path, special):
    """pixfeed doctor reads a dataset's files to time its storage: a data file that is (a link to) /dev/zero
    read for ever, a FIFO blocked; both are refused by name at once (run in a child, killed if it hangs)."""
    target = tmp_path / "fifo"
    os.mkfifo(target)
    dataset = tmp_path / "ds"
    dataset.mkdir()
    (dataset / "data.bin").symlink_to(special if special == "/dev/zero" else target)
    done = run_child(f"""
        from pixfeed.errors import SpecialFileError
        from pixfeed.storage.pagecache import read_rate
        for cold in (False, True):
            try:
                read_rate([{str(dataset / "data.bin")!r}], cold=cold)
            except SpecialFileError as e:
                print("refused:", e)
    """)
    assert done.returncode == 0 and done.stdout.count("refused:") == 2 and "data.bin" in done.stdout, done
