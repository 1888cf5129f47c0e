"""``pixfeed.pack_samples``: samples given in Python (an iterable of dicts, or a function over inputs run in
parallel) pack like any source; bad samples are named; and the COCO example's masks and boxes line up with
its images after random crops and flips."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import pixfeed
from pixfeed.datasets import open_dataset
from pixfeed.errors import OptionError, SourceError


def image(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, (12 + i % 3, 16, 3), dtype=np.uint8)


def samples_of(x: int):
    """Two samples per input; input 13 raises."""
    if x == 13:
        raise ValueError("unlucky input")
    for j in range(2):
        yield {"image": image(2 * x + j), "key": f"{x:03d}-{j}", "label": ["cat", "dog"][j], "caption": f"in {x}",
               "boxes": np.array([[0, 0, 4 + j, 5]], np.float32), "score": 0.5 * x}


def files(path: Path) -> dict:
    m = json.loads((path / "pixfeed.json").read_text())
    return {name: meta["xxh3_64"] for name, meta in m["files"].items()}


@pytest.mark.parametrize("fmt", ["mmap", "wds"])
def test_an_iterable_and_a_function_over_inputs_pack_the_same(tmp_path, fmt):
    inputs = [3, 1, 2]
    listed = [s for x in inputs for s in samples_of(x)]
    a = pixfeed.pack_samples(iter(listed), tmp_path / "a", fmt, store="encoded", schema={"boxes": "boxes"})
    b = pixfeed.pack_samples(samples_of, tmp_path / "b", fmt, inputs=inputs, store="encoded",
                             schema={"boxes": "boxes"}, workers=2)
    assert files(tmp_path / "a") == files(tmp_path / "b") and a["count"] == b["count"] == 6
    assert a["classes"] == ["cat", "dog"] and b["source"] == {"kind": "python", "function": "samples_of", "inputs": 3}
    ds = open_dataset(tmp_path / "a", fields=None)
    got = list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))]
    by_key = {s["key"]: s for s in listed}
    keys = json.loads((tmp_path / "a" / "keys.json").read_text())
    assert sorted(keys) == sorted(by_key)
    for r in got:
        key = next(k for k in keys if by_key[k]["caption"] == r["caption"] and
                   by_key[k]["boxes"][0, 2] == r["boxes"][0, 2].item())
        s = by_key[key]
        assert torch.equal(r["image"], torch.from_numpy(s["image"]).permute(2, 0, 1))  # a lossless PNG
        assert r["score"] == s["score"] and r["label"] == ["cat", "dog"].index(s["label"])


def test_a_raising_function_follows_on_error(tmp_path):
    with pytest.raises(SourceError, match=r"input 1 \(13\): samples_of raised ValueError: unlucky input"):
        pixfeed.pack_samples(samples_of, tmp_path / "out", "mmap", inputs=[1, 13, 2], store="encoded",
                             schema={"boxes": "boxes"})
    assert not (tmp_path / "out").exists()
    m = pixfeed.pack_samples(samples_of, tmp_path / "out", "mmap", inputs=[1, 13, 2], store="encoded",
                             schema={"boxes": "boxes"}, on_error="skip")
    assert m["count"] == 4 and any("input 1 (13): samples_of raised" in n for n in m["notes"])


def test_bad_samples_are_named(tmp_path):
    with pytest.raises(SourceError, match=r"sample 1: no 'image' .* its keys: caption"):
        pixfeed.pack_samples([{"image": image(0)}, {"caption": "x"}], tmp_path / "out")
    with pytest.raises(SourceError, match=r"sample 1: fields caption, n differ from the first sample's \(caption\)"):
        pixfeed.pack_samples([{"image": image(0), "caption": "a"}, {"image": image(1), "caption": "b", "n": 1}],
                             tmp_path / "out")
    with pytest.raises(SourceError, match=r"sample 0: image is a list; give a path"):
        pixfeed.pack_samples([{"image": [1, 2, 3]}], tmp_path / "out")
    with pytest.raises(SourceError, match="two samples of key 'a'"):
        pixfeed.pack_samples([{"image": image(0), "key": "a"}, {"image": image(1), "key": "a"}], tmp_path / "out")
    with pytest.raises(OptionError, match="schema: no sample has a field 'boxes'"):
        pixfeed.pack_samples([{"image": image(0)}], tmp_path / "out", schema={"boxes": "boxes"})
    with pytest.raises(OptionError, match="inputs=\\[...\\]"):
        pixfeed.pack_samples(samples_of, tmp_path / "out")
    assert not (tmp_path / "out").exists()


COLOURS = {1: (220, 40, 40), 2: (40, 200, 40), 3: (40, 60, 220)}


def test_the_coco_example_lines_masks_and_boxes_up_with_the_images(coco, tmp_path):
    root = coco.make_sample(tmp_path / "sample", count=8)
    m = coco.convert(root / "annotations.json", root / "images", tmp_path / "ds", "mmap", store="encoded")
    assert m["count"] == 8 and [f["name"] for f in m["schema"]] == ["boxes", "box_classes", "mask"]
    assert m["classes"] == ["background", "red", "green", "blue"]  # id 0, the masks' background: not "0"
    assert coco.class_names([{"id": 0, "name": "person"}, {"id": 2, "name": "car"}]) == ["person", "1", "car"]
    ds = open_dataset(tmp_path / "ds", fields=("image", "mask", "boxes", "box_classes"), size=40, crop="random")
    agree = total = 0
    for i in range(len(ds)):
        torch.manual_seed(i)
        img, mask, boxes, classes = ds[i]
        pixels = img.permute(1, 2, 0).numpy().astype(int)
        for c, colour in COLOURS.items():  # pixels of a pure category colour: the mask says that category
            pure = (np.abs(pixels - colour).sum(axis=2) < 6)
            total += int(pure.sum())
            agree += int((mask.numpy()[pure] == c).sum())
        black = pixels.sum(axis=2) < 6
        agree += int((mask.numpy()[black] == 0).sum())
        total += int(black.sum())
        assert len(boxes) == len(classes)
        for box, c in zip(boxes.tolist(), classes.tolist()):  # each box still holds its category somewhere
            x0, y0, x1, y1 = (int(round(v)) for v in box)
            assert (mask.numpy()[y0:max(y1, y0 + 1), x0:max(x1, x0 + 1)] == c).any() or x1 - x0 < 2 or y1 - y0 < 2
    assert total > 1000 and agree / total > 0.99, (agree, total)


def test_values_of_two_types_in_one_field_name_both_samples(tmp_path):
    two = [{"image": image(0), "n": 1}, {"image": image(1), "n": "a"}]
    with pytest.raises(SourceError, match=r"field 'n': its values are of different types, 1 in sample 0 and 'a' in "
                                          r"sample 1; .*schema=\{'n': TYPE\}"):
        pixfeed.pack_samples(two, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
    m = pixfeed.pack_samples(two, tmp_path / "ds", schema={"n": "json"})
    ds = open_dataset(tmp_path / "ds", fields=("n",))
    assert m["schema"] == [{"name": "n", "type": "json"}] and [ds[i][0] for i in range(2)] == [1, "a"]


@pytest.mark.parametrize("fmt", ["mmap", "lmdb", "hdf5", "wds"])
def test_class_indices_without_names_pack_into_every_format(tmp_path, fmt):
    """Labels given as indices pack into every format, their classes named "0".."N" as shards' .cls are
    (wds's shard planning once looked a name up for each and failed past index 0)."""
    m = pixfeed.pack_samples([{"image": image(i), "label": i % 3} for i in range(6)], tmp_path / "ds", format=fmt)
    ds = open_dataset(tmp_path / "ds", **({"shuffle": False} if fmt == "wds" else {}))
    labels = [label for _, label in ds] if fmt == "wds" else [ds[i][1] for i in range(len(ds))]
    assert m["classes"] == ["0", "1", "2"] and sorted(labels) == sorted(i % 3 for i in range(6))


def test_numpy_scalars_are_typed_as_the_values_they_hold(tmp_path):
    """np.float32(0.5) and np.int64(3) in a sample are a float and an int field (they failed with
    "Object of type float32 is not JSON serializable")."""
    m = pixfeed.pack_samples([{"image": image(i), "score": np.float32(i / 2), "n": np.int64(i)} for i in range(3)],
                             tmp_path / "ds", workers=1)
    assert m["schema"] == [{"name": "score", "type": "float"}, {"name": "n", "type": "int"}]
    ds = open_dataset(tmp_path / "ds", fields=("score", "n"))
    assert [tuple(ds[i]) for i in range(3)] == [(0.0, 0), (0.5, 1), (1.0, 2)]


def test_pil_images_pack_losslessly_and_bad_images_and_labels_are_named(tmp_path):
    from PIL import Image

    pictures = [Image.new("RGB", (8, 6), (10, 20, 30)), Image.new("L", (4, 4), 7), Image.new("CMYK", (5, 5))]
    pixfeed.pack_samples([{"image": p} for p in pictures], tmp_path / "ds", store="encoded", workers=1)
    ds = open_dataset(tmp_path / "ds")
    assert ds[0][0][:, 0, 0].tolist() == [10, 20, 30] and tuple(ds[0][0].shape) == (3, 6, 8)
    assert ds[1][0][:, 0, 0].tolist() == [7, 7, 7] and tuple(ds[2][0].shape) == (3, 5, 5)
    cases = [
        ([{"image": np.zeros((8, 8, 3), np.float32)}],
         r"sample 0: image is a float32 array of shape \(8, 8, 3\); give .* a PIL image or an HxWx3"),
        ([{"image": image(0), "label": 2}, {"image": image(1), "label": -2}],  # -1 is unlabelled (data-rules.md)
         r"sample 1: label -2 is negative; a label is a class index \(an integer >= 0\) or -1 for unlabelled"),
        ([{"image": image(0), "label": 1}, {"image": image(1), "label": "cat"}],
         r"sample 1: label 'cat' is a class name and sample 0's 1 a class index"),
        ([{"image": image(0), "label": True}], r"sample 0: label True is neither"),
    ]
    for samples, match in cases:
        with pytest.raises(SourceError, match=match):
            pixfeed.pack_samples(samples, tmp_path / "bad", workers=1)
        assert not (tmp_path / "bad").exists()


def test_sparse_class_ids_are_kept_without_names(tmp_path):
    """Ids far apart (5 and 10**9) stay the labels, with no list of a billion class names."""
    m = pixfeed.pack_samples([{"image": image(i), "label": v} for i, v in enumerate([5, 10 ** 9])], tmp_path / "ds",
                             workers=1)
    ds = open_dataset(tmp_path / "ds")
    assert m["classes"] is None and [ds[i][1] for i in range(2)] == [5, 10 ** 9]
