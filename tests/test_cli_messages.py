"""What the commands print for one image and for a bad count: counts in words a user reads."""
from __future__ import annotations

from pixfeed.cli import main
from pixfeed.console.words import human_bytes, plural


def test_plural_and_bytes():
    assert (plural(1, "image"), plural(0, "image"), plural(1200, "batch", "batches")) == \
        ("1 image", "0 images", "1,200 batches")
    assert (human_bytes(512), human_bytes(24_600), human_bytes(11.8e6)) == ("512 B", "24.6 KB", "11.8 MB")


def test_one_image_is_one_image(tmp_path, capsys):
    assert main(["sample", str(tmp_path / "src"), "--count", "1"]) == 0
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--size", "16", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "wrote 1 image to" in out and "packed 1 image (" in out


def test_skipped_files_are_named_once_and_verify_counts_in_words(tmp_path, capsys):
    assert main(["sample", str(tmp_path / "src"), "--count", "1"]) == 0
    (tmp_path / "src" / "bird" / "empty.png").write_bytes(b"")
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--size", "16", "--workers", "1",
                 "--on-error", "skip"]) == 0
    err = capsys.readouterr().err
    assert "skipped: " in err and err.count("empty.png") == 1
    assert main(["verify", str(tmp_path / "ds")]) == 0
    assert "1 record checked" in capsys.readouterr().out


def test_sample_refuses_no_images(tmp_path, capsys):
    assert main(["sample", str(tmp_path / "src"), "--count", "0"]) == 2
    assert "--count 0: must be at least 1" in capsys.readouterr().err


def test_demo_summary_reads_as_words(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--count", "8", "--size", "32", "-q"]) == 0
    out = capsys.readouterr().out
    assert "wrote 8 synthetic images" in out and "8 records, 32x32x3 uint8" in out and "read 8 images back" in out
    assert "batches of (8, 3, 32, 32) torch.uint8" in out  # a batch's shape, not one sample's


def test_sample_refuses_a_folder_it_did_not_write_and_replaces_its_own_only_when_asked(tmp_path, capsys):
    theirs = tmp_path / "theirs" / "cat"
    theirs.mkdir(parents=True)
    (theirs / "photo.jpg").write_bytes(b"a user's image")
    assert main(["sample", str(tmp_path / "theirs"), "--count", "2"]) == 2
    assert "not empty (it holds cat/photo.jpg)" in capsys.readouterr().err
    assert main(["sample", str(tmp_path / "theirs"), "--count", "2", "--overwrite"]) == 2  # not a sample: never
    assert (theirs / "photo.jpg").read_bytes() == b"a user's image" and len(list(theirs.iterdir())) == 1

    ours = tmp_path / "ours"
    assert main(["sample", str(ours), "--count", "16"]) == 0
    assert main(["sample", str(ours), "--count", "3"]) == 2
    assert "pass --overwrite to replace it" in capsys.readouterr().err
    assert main(["sample", str(ours), "--count", "3", "--overwrite"]) == 0
    images = sorted(p.relative_to(ours).as_posix() for p in ours.rglob("img_*"))
    assert images == ["bird/img_00000.jpg", "boat/img_00001.jpg", "cat/img_00002.jpg"]  # no mix with the 16
    assert sorted(p.name for p in ours.iterdir() if p.is_dir()) == ["bird", "boat", "cat"]
    (ours / "cat" / "notes.txt").write_text("mine")
    assert main(["sample", str(ours), "--count", "3", "--overwrite"]) == 2
    assert "holds cat/notes.txt, which pixfeed sample did not write" in capsys.readouterr().err
    assert (ours / "cat" / "notes.txt").exists() and (ours / "bird" / "img_00000.jpg").exists()


def test_demo_removes_its_temporary_folder_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    assert main(["demo", "--count", "8", "--size", "32", "-q"]) == 0
    out = capsys.readouterr().out
    assert "4. removed " in out and "pass --out DIR to keep" in out and list(tmp_path.iterdir()) == []
    assert main(["demo", "--out", str(tmp_path / "kept"), "--count", "8", "--size", "32", "-q"]) == 0
    assert f"4. kept {tmp_path / 'kept'} (" in capsys.readouterr().out and (tmp_path / "kept" / "packed-mmap").is_dir()


def _one_line_error(capsys, expected: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and expected in err, err


def test_bad_paths_are_one_line_errors_with_exit_2(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert main(["sample", str(a_file)]) == 2
    _one_line_error(capsys, f"DIR {a_file}: is a file, not a folder")
    assert main(["sample", "/proc/nope"]) == 2
    _one_line_error(capsys, "DIR /proc/nope: cannot create the folder (")
    assert main(["sample", str(a_file / "below")]) == 2
    _one_line_error(capsys, "cannot create the folder (Not a directory)")
    assert main(["demo", "--out", str(a_file)]) == 2
    _one_line_error(capsys, f"--out {a_file}: is a file, not a folder")
    assert main(["sample", str(tmp_path / "src"), "--count", "2", "-q"]) == 0
    assert main(["pack", str(tmp_path / "src"), str(a_file / "ds"), "-q"]) == 2
    _one_line_error(capsys, f"parent folder {a_file} is a file, not a folder")
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "none" / "ds"), "-q"]) == 2
    _one_line_error(capsys, f"parent folder {tmp_path / 'none'} does not exist")


def test_the_sample_does_not_give_the_class_away_by_file_type(tmp_path):
    """Across the 8 classes every (format, mode) appears in every class as often: none predicts the class."""
    from collections import Counter

    from PIL import Image

    from pixfeed.sample import CLASSES, make_sample

    make_sample(tmp_path, count=8 * 16)
    kinds = Counter()
    for path in tmp_path.rglob("*.*"):
        with Image.open(path) as img:
            kinds[(img.format, img.mode), path.parent.name] += 1
    per_kind = {kind for kind, _ in kinds}
    assert len(per_kind) >= 4  # grayscale JPEG, RGB JPEG, RGB PNG, RGBA PNG
    for kind in per_kind:
        counts = [kinds[kind, cls] for cls in CLASSES]
        assert min(counts) == max(counts) > 0, (kind, counts)


def test_info_names_the_skipped_files(tmp_path, capsys):
    assert main(["sample", str(tmp_path / "src"), "--count", "8", "-q"]) == 0
    for i in range(7):
        (tmp_path / "src" / "bird" / f"bad{i}.png").write_bytes(b"")
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "ds"), "--size", "16", "--on-error", "skip", "-q"]) == 0
    assert main(["info", str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert "skipped   7:" in out and out.count("empty file (0 bytes)") == 5 and "bad0.png" in out
    assert "and 2 more (pixfeed info --json lists them all)" in out
