"""What the commands print for one image and for a bad count: counts in words a user reads."""
from __future__ import annotations

from pixfeed.cli import main
from pixfeed.words import human_bytes, plural


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
