"""Scanning a source folder: classes as torchvision's find_classes lists them,
symbolic links to folders, and file names that cannot become keys."""
from __future__ import annotations

import os

import pytest
from conftest import write_image

from pixfeed.errors import SourceError
from pixfeed.packers import pack
from pixfeed.sources.folder import scan


def test_a_class_folder_without_images_keeps_its_label(tmp_path):
    for c in ("ant", "bee", "cat"):
        (tmp_path / "src" / c).mkdir(parents=True)
    write_image(tmp_path / "src" / "ant" / "a.jpg")
    write_image(tmp_path / "src" / "cat" / "c.png", fmt="PNG")
    (tmp_path / "src" / "bee" / "notes.txt").write_text("no images here")
    source = scan(tmp_path / "src")
    assert source.classes == ["ant", "bee", "cat"] and source.labels.tolist() == [0, 2]
    m = pack(tmp_path / "src", tmp_path / "ds", "mmap", size=8, workers=1)
    assert m["classes"] == ["ant", "bee", "cat"]
    assert any("bee (label 1)" in n for n in m["notes"]), m["notes"]


def test_symbolic_links_to_folders_are_followed_but_not_loops(tmp_path):
    src, elsewhere = tmp_path / "src", tmp_path / "elsewhere" / "dog"
    write_image(src / "cat" / "c.jpg")
    write_image(elsewhere / "d.jpg")
    os.symlink(elsewhere, src / "dog")
    os.symlink(src, src / "cat" / "loop")  # back to the root: a loop
    os.symlink(elsewhere, src / "cat" / "again")  # a second way to a folder: followed, as torchvision does
    source = scan(src)
    assert source.paths == ["cat/again/d.jpg", "cat/c.jpg", "dog/d.jpg"] and source.labels.tolist() == [0, 0, 1]


def test_a_file_name_that_is_not_utf8_is_refused_by_name(tmp_path):
    write_image(tmp_path / "src" / "ok.jpg")
    try:
        bad = os.path.join(os.fsencode(tmp_path / "src"), b"caf\xe9.jpg")
        os.link(os.fsencode(tmp_path / "src" / "ok.jpg"), bad)
    except OSError as e:  # some file systems only take UTF-8 names
        pytest.skip(f"cannot create a non-UTF-8 file name here: {e}")
    with pytest.raises(SourceError, match=r"1 file name\(s\) not valid UTF-8.*caf\\udce9\.jpg"):
        pack(tmp_path / "src", tmp_path / "ds", "mmap", size=8, workers=1)
    assert not (tmp_path / "ds").exists()
