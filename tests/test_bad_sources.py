"""Damage named the same way in every format: a failing pack names the first bad image in source order
(a wds pack's tasks hold shuffled samples), and verify names every damaged sample of a wds pack."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import flip_stored, make_tree

from pixfeed.errors import SourceError
from pixfeed.packers import pack
from pixfeed.registry import FORMATS
from pixfeed.sources.folder import scan
from pixfeed.verify.check import verify


@pytest.fixture(scope="module")
def two_bad(tmp_path_factory):
    """12 images, two of them unreadable: the later one in source order comes first in wds's shuffle."""
    src = make_tree(tmp_path_factory.mktemp("bad") / "src")
    paths = scan(src).paths
    order = np.random.default_rng(0).permutation(len(paths)).tolist()  # the wds writer's shuffle, seed 0
    late = next(i for i in order if i > 0)  # shuffled first among those with an earlier image
    early = next(i for i in range(late) if order.index(i) > order.index(late))
    for i in (early, late):
        (src / paths[i]).write_bytes(b"not an image at all")
    return src, paths[early]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_pack_names_the_first_bad_image_in_source_order(two_bad, tmp_path, fmt, workers):
    src, first = two_bad
    with pytest.raises(SourceError, match=first):
        pack(src, tmp_path / "ds", fmt, store="pixels", size=16, workers=workers)
    assert not (tmp_path / "ds").exists()


def test_every_damaged_sample_of_a_wds_pack_is_reported(tmp_path):
    """Not only the first: the walk goes on past a damaged sample, as for the other formats."""
    src, dst = make_tree(tmp_path / "src"), tmp_path / "ds"
    pack(src, dst, "wds", store="encoded", workers=1, shard_size=5, shuffle=False)
    damaged = ["cat/img1", "dog/img2", "eel/img3"]  # in the first, second and third shard
    for key in damaged:
        assert flip_stored(sorted(dst.glob("*.tar")), next(src.glob(f"{key}.*")).read_bytes()) is not None, key
    report = verify(dst)
    problems = [p for p in report.problems if "stored bytes fail their xxh3_64 checksum" in p]
    assert [next(k for k in damaged if repr(k) in p) for p in problems] == damaged, report.problems
    assert report.records == 12 - 3
