"""Index files, shards and samples as other tools write them (issue 38, items 1, 3, 4, 5, 9): Hugging Face
``datasets`` Parquet with -1 labels, nulls, ``ClassLabel`` names, embedded images that share a file name, and
path-only Parquet (``Dataset.to_parquet``).  The rules: docs/data-rules.md.

The Parquet files are written by ``datasets`` itself where it is installed (the ``test`` extra has it); without
it, by pyarrow with the same columns and the same ``huggingface`` schema metadata."""
from __future__ import annotations

import io
import json
import math
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import pixfeed
from pixfeed.cli import main as cli
from pixfeed.datasets import open_dataset
from pixfeed.errors import OptionError, SourceError
from pixfeed.verify.check import verify

FORMATS = ("mmap", "lmdb", "hdf5", "wds")


def jpeg(i: int, size=(12, 10)) -> bytes:
    rng = np.random.default_rng(i)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def hf_parquet(path: Path, columns: dict, features: dict, embed: bool = True) -> Path:
    """A Parquet file as Hugging Face ``datasets`` writes it: ``columns`` {name: values}; ``features``
    {name: "image" | "string" | "int64" | "float64" | ("label", [names] or None) | ("list", "string")};
    image values are file paths, embedded as bytes under their basename (``embed``, as push_to_hub and
    embed_table_storage do) or kept as paths (``Dataset.to_parquet``)."""
    try:
        import datasets
    except ImportError:
        return _hand_written(path, columns, features, embed)
    spec = {}
    for name, kind in features.items():
        if kind == "image":
            spec[name] = datasets.Image()
        elif isinstance(kind, tuple) and kind[0] == "label":
            spec[name] = datasets.ClassLabel(names=kind[1]) if kind[1] else datasets.Value("int64")
        elif isinstance(kind, tuple) and kind[0] == "list":
            spec[name] = datasets.Sequence(datasets.Value(kind[1]))
        else:
            spec[name] = datasets.Value(kind)
    ds = datasets.Dataset.from_dict({k: [str(v) if isinstance(v, Path) else v for v in vs]
                                     for k, vs in columns.items()}, features=datasets.Features(spec))
    if embed:
        import pyarrow.parquet as pq
        from datasets.table import embed_table_storage

        pq.write_table(embed_table_storage(ds.data.table), path)
    else:
        ds.to_parquet(str(path))
    return path


def _hand_written(path: Path, columns: dict, features: dict, embed: bool) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays, meta = {}, {}
    for name, kind in features.items():
        values = columns[name]
        if kind == "image":
            arrays[name] = pa.array([{"bytes": Path(v).read_bytes() if embed else None,
                                      "path": Path(v).name if embed else str(v)} for v in values],
                                    pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
            meta[name] = {"_type": "Image"}
        elif isinstance(kind, tuple) and kind[0] == "label":
            arrays[name] = pa.array(values, pa.int64())
            meta[name] = {"names": kind[1], "_type": "ClassLabel"} if kind[1] else {"dtype": "int64", "_type": "Value"}
        elif isinstance(kind, tuple) and kind[0] == "list":
            arrays[name] = pa.array(values, pa.list_(pa.string()))
            meta[name] = {"feature": {"dtype": kind[1], "_type": "Value"}, "_type": "Sequence"}
        else:
            arrays[name] = pa.array(values, {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64()}[kind])
            meta[name] = {"dtype": kind, "_type": "Value"}
    table = pa.table(arrays).replace_schema_metadata({"huggingface": json.dumps({"info": {"features": meta}})})
    pq.write_table(table, path)
    return path


def images(folder: Path, names) -> list:
    """Write a distinct small image at each relative name under ``folder``; their absolute paths."""
    out = []
    for i, name in enumerate(names):
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(jpeg(i))
        out.append(p)
    return out


def records(path, fields=("label",)):
    """Every record's ``fields``, in the dataset's order (a wds dataset streamed unshuffled)."""
    wds = pixfeed.read_manifest(path)["format"] == "wds"
    ds = open_dataset(path, fields=fields, **({"shuffle": False} if wds else {}))
    return list(ds) if wds else [ds[i] for i in range(len(ds))]


def labels_of(path) -> list:
    got = records(path, fields=("label",))
    return [int(r[0]) if isinstance(r, tuple) else int(r) for r in got]


def pack_index(index, dst, src=..., **kw):
    """Pack an index file; SRC: the index's own folder unless given (None: no SRC)."""
    kw.setdefault("workers", 1)
    src = Path(index).parent if src is ... else src
    return pixfeed.pack(src, dst, kw.pop("format", "mmap"), index=str(index), store=kw.pop("store", "encoded"), **kw)


# --- 1: -1 labels: unlabelled, kept, in every source --------------------------------------------------------------

HF_TEST_LABELS = [-1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1]


@pytest.mark.parametrize("fmt", FORMATS)
def test_minus_one_in_an_integer_class_column_is_unlabelled_and_no_label_moves(tmp_path, fmt):
    """The issue's column: [-1, 1, 2, ..., 11, 0, 1] came back [0, 2, 4, 5, ..., 3, 1, 2] with classes
    ['-1', '0', '1', '11', '2', ...] (taken as names, sorted as text)."""
    paths = images(tmp_path / "data" / "img", [f"{i:03d}.png" for i in range(len(HF_TEST_LABELS))])
    index = hf_parquet(tmp_path / "data" / "test.parquet", {"image": paths, "label": HF_TEST_LABELS},
                       {"image": "image", "label": ("label", None)})
    m = pack_index(index, tmp_path / "ds", format=fmt)
    assert m["classes"] == [str(c) for c in range(12)]
    if fmt == "wds":  # shuffled into its shards at pack time
        assert sorted(labels_of(tmp_path / "ds")) == sorted(HF_TEST_LABELS)
    else:
        assert labels_of(tmp_path / "ds") == HF_TEST_LABELS
    assert any("1 of 14 rows unlabelled" in n for n in m["notes"]), m["notes"]
    assert verify(tmp_path / "ds").ok


def test_an_all_unlabelled_split_stays_unlabelled(tmp_path):
    """A test split of -1 only became class 0 (and the CSV's "-1" text too)."""
    paths = images(tmp_path / "data" / "img", ["a.png", "b.png", "c.png"])
    index = hf_parquet(tmp_path / "data" / "test.parquet", {"image": paths, "label": [-1, -1, -1]},
                       {"image": "image", "label": ("label", ["cat", "dog"])})
    m = pack_index(index, tmp_path / "ds")
    assert labels_of(tmp_path / "ds") == [-1, -1, -1] and m["classes"] == ["cat", "dog"]
    (tmp_path / "data" / "i.csv").write_text("image,label\nimg/a.png,-1\nimg/b.png,-1\nimg/c.png,2\n")
    m = pack_index(tmp_path / "data" / "i.csv", tmp_path / "csv")
    assert labels_of(tmp_path / "csv") == [-1, -1, 2] and m["classes"] == ["0", "1", "2"]
    (tmp_path / "data" / "j.jsonl").write_text("".join(json.dumps({"image": f"img/{n}.png", "label": v}) + "\n"
                                              for n, v in zip("abc", [None, "dog", "cat"])))
    m = pack_index(tmp_path / "data" / "j.jsonl", tmp_path / "names")  # names: a null is unlabelled
    assert labels_of(tmp_path / "names") == [-1, 1, 0] and m["classes"] == ["cat", "dog"]


def test_other_negative_labels_are_refused_naming_the_row(tmp_path):
    images(tmp_path / "data" / "img", ["a.png", "b.png"])
    (tmp_path / "data" / "i.csv").write_text("image,label\nimg/a.png,3\nimg/b.png,-2\n")
    with pytest.raises(SourceError, match=r"i\.csv: line 3, column 'label': label -2 is negative; .* -1 for "
                                          "unlabelled"):
        pack_index(tmp_path / "data" / "i.csv", tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_sparse_integer_labels_are_kept_in_order(tmp_path):
    """Ids far apart were names sorted as text (5 after 1000000000); they stay the labels, as .cls's do."""
    images(tmp_path / "data" / "img", ["a.png", "b.png", "c.png"])
    (tmp_path / "data" / "i.jsonl").write_text("".join(json.dumps({"image": f"img/{n}.png", "label": v}) + "\n"
                                              for n, v in zip("abc", [5, 10 ** 9, -1])))
    m = pack_index(tmp_path / "data" / "i.jsonl", tmp_path / "ds")
    assert m["classes"] is None and labels_of(tmp_path / "ds") == [5, 10 ** 9, -1]
    assert verify(tmp_path / "ds").ok


def shard(path: Path, samples) -> Path:
    """A WebDataset shard as webdataset.TarWriter writes one: KEY.png, KEY.cls per sample."""
    with tarfile.open(path, "w") as tar:
        for i, (key, cls) in enumerate(samples):
            for ext, data in (("png", jpeg(i)), ("cls", None if cls is None else str(cls).encode())):
                if data is None:
                    continue
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_a_cls_of_minus_one_is_unlabelled_and_a_missing_cls_is_named_truly(tmp_path):
    """A .cls of -1 was refused with "sample X has a .cls member but Y has none", Y holding -1."""
    (tmp_path / "data" / "shards").mkdir(parents=True)
    shard(tmp_path / "data" / "shards" / "s-000.tar", [("a", 2), ("b", -1), ("c", 0)])
    m = pixfeed.pack(tmp_path / "data" / "shards", tmp_path / "ds", "lmdb", workers=1)
    assert labels_of(tmp_path / "ds") == [2, -1, 0] and m["classes"] == ["0", "1", "2"]
    assert any("1 of 3 samples unlabelled" in n for n in m["notes"])
    shard(tmp_path / "data" / "shards" / "s-000.tar", [("a", 2), ("b", None)])
    with pytest.raises(SourceError, match=r"sample 'a' has a \.cls member but 'b' has none; .*-1 for unlabelled"):
        pixfeed.pack(tmp_path / "data" / "shards", tmp_path / "bad", "lmdb", workers=1)
    shard(tmp_path / "data" / "shards" / "s-000.tar", [("a", 2), ("b", -7)])
    with pytest.raises(SourceError, match=r"s-000\.tar: member b\.cls: label -7 is negative"):
        pixfeed.pack(tmp_path / "data" / "shards", tmp_path / "bad", "lmdb", workers=1)


def test_pack_samples_takes_minus_one_as_unlabelled(tmp_path):
    """pack_samples refused -1 (clearly, but unlike the other sources); it is unlabelled there too."""
    m = pixfeed.pack_samples([{"image": jpeg(i), "label": v} for i, v in enumerate([1, -1, 0])], tmp_path / "ds",
                             "wds", workers=1, shuffle=False)
    assert labels_of(tmp_path / "ds") == [1, -1, 0] and m["classes"] == ["0", "1"]
    with tarfile.open(next((tmp_path / "ds").glob("*.tar"))) as tar:  # the stock .json meta: no class for -1
        metas = [json.loads(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".json")]
    assert [(d["label"], d["class"]) for d in metas] == [(1, "1"), (-1, None), (0, "0")]
    m = pixfeed.pack_samples([{"image": jpeg(i), "label": v} for i, v in enumerate(["cat", -1])], tmp_path / "n",
                             workers=1)
    assert labels_of(tmp_path / "n") == [0, -1] and m["classes"] == ["cat"]
    with pytest.raises(SourceError, match=r"sample 1: label -3 is negative"):
        pixfeed.pack_samples([{"image": jpeg(0), "label": 0}, {"image": jpeg(1), "label": -3}], tmp_path / "bad",
                             workers=1)


# --- 3: nulls ------------------------------------------------------------------------------------------------------

def test_nulls_are_json_null_and_float_nan_and_others_say_how_to_proceed(tmp_path):
    paths = images(tmp_path / "data" / "img", ["a.png", "b.png", "c.png"])
    index = hf_parquet(tmp_path / "data" / "train.parquet",
                       {"image": paths, "caption": ["a cat", None, "a dog"], "tags": [["x"], None, []],
                        "score": [0.5, None, 1.5], "n": [1, 2, None]},
                       {"image": "image", "caption": "string", "tags": ("list", "string"), "score": "float64",
                        "n": "int64"})
    with pytest.raises(SourceError, match=r"train\.parquet: row 1, column 'caption': null for field caption "
                                          r"\(str\), which has no missing value; .*--fill caption=VALUE.*--field "
                                          r"caption:json"):
        pack_index(index, tmp_path / "ds")
    m = pack_index(index, tmp_path / "ds", field=["caption:json", "n:json"])
    got = records(tmp_path / "ds", fields=("caption", "tags", "score", "n"))
    assert [g[0] for g in got] == ["a cat", None, "a dog"] and [g[1] for g in got] == [["x"], None, []]
    assert [g[3] for g in got] == [1, 2, None]
    assert got[0][2] == 0.5 and math.isnan(got[1][2]) and got[2][2] == 1.5
    assert {f["name"]: f["type"] for f in m["schema"]}["score"] == "float"
    m = pack_index(index, tmp_path / "filled", fill=["caption=", "n=-1"])
    got = records(tmp_path / "filled", fields=("caption", "n"))
    assert [tuple(g) for g in got] == [("a cat", 1), ("", 2), ("a dog", -1)]
    assert m["options"]["fill"] == ["caption=", "n=-1"]


def test_csv_empty_cells_and_the_fill_option(tmp_path):
    images(tmp_path / "data" / "img", ["a.png", "b.png"])
    (tmp_path / "data" / "i.csv").write_text('image,n,score,meta\nimg/a.png,3,0.5,{"k": 1}\nimg/b.png,,,\n')
    with pytest.raises(SourceError, match=r"i\.csv: line 3, column 'n': empty cell for field n \(int\), which has "
                                          r"no missing value; .*--fill n=VALUE"):
        pack_index(tmp_path / "data" / "i.csv", tmp_path / "ds")
    assert cli(["pack", "-q", "--workers", "1", "--index", str(tmp_path / "data" / "i.csv"), "--fill", "n=0",
                str(tmp_path / "data"), str(tmp_path / "ds")]) == 0
    got = records(tmp_path / "ds", fields=("n", "score", "meta"))
    assert got[0][:1] == (3,) and got[1][0] == 0 and math.isnan(got[1][1]) and [g[2] for g in got] == [{"k": 1}, None]
    with pytest.raises(OptionError, match=r"--fill x=1: .* has no field column 'x'"):
        pack_index(tmp_path / "data" / "i.csv", tmp_path / "bad", fill=["x=1"])
    with pytest.raises(SourceError, match=r"--fill n=two: 'two' is not an integer"):
        pack_index(tmp_path / "data" / "i.csv", tmp_path / "bad", fill=["n=two"])
    with pytest.raises(OptionError, match=r"--fill applies to an index file source only"):
        pixfeed.pack(tmp_path / "data" / "img", tmp_path / "bad", "mmap", fill=["n=0"])


def test_pack_samples_nulls_follow_the_same_rules(tmp_path):
    samples = [{"image": jpeg(0), "note": {"a": 1}, "score": 1.0}, {"image": jpeg(1), "note": None, "score": None}]
    pixfeed.pack_samples(samples, tmp_path / "ds", workers=1)
    got = records(tmp_path / "ds", fields=("note", "score"))
    assert got[0] == ({"a": 1}, 1.0) and got[1][0] is None and math.isnan(got[1][1])
    with pytest.raises(SourceError, match=r"sample 1, field caption: null for field caption \(str\).*schema="
                                          r"\{'caption': 'json'\}"):
        pixfeed.pack_samples([{"image": jpeg(0), "caption": "x"}, {"image": jpeg(1), "caption": None}],
                             tmp_path / "bad", workers=1)


# --- 4: class names ------------------------------------------------------------------------------------------------

def test_class_label_names_come_from_the_parquet(tmp_path):
    """500 of 500 names were lost: classes came out '0'..'N-1'."""
    paths = images(tmp_path / "data" / "img", [f"{i}.png" for i in range(4)])
    names = ["tench", "English springer", "cassette player"]
    index = hf_parquet(tmp_path / "data" / "train.parquet", {"image": paths, "label": [2, 0, 1, -1]},
                       {"image": "image", "label": ("label", names)})
    m = pack_index(index, tmp_path / "ds", format="wds", shuffle=False)
    assert m["classes"] == names and labels_of(tmp_path / "ds") == [2, 0, 1, -1]
    with tarfile.open(next((tmp_path / "ds").glob("*.tar"))) as tar:
        metas = [json.loads(tar.extractfile(t).read()) for t in tar.getmembers() if t.name.endswith(".json")]
    assert [d["class"] for d in metas] == ["cassette player", "tench", "English springer", None]


def test_class_names_file_names_integer_labels_of_every_source(tmp_path):
    images(tmp_path / "data" / "img", ["a.png", "b.png", "c.png"])
    (tmp_path / "data" / "i.csv").write_text("image,label\nimg/a.png,1\nimg/b.png,0\nimg/c.png,-1\n")
    (tmp_path / "data" / "names.txt").write_text("zebra\naardvark\n")
    (tmp_path / "data" / "names.json").write_text(json.dumps(["zebra", "aardvark", "moth"]))
    assert cli(["pack", "-q", "--workers", "1", "--index", str(tmp_path / "data" / "i.csv"), "--class-names",
                str(tmp_path / "data" / "names.txt"), str(tmp_path / "data"), str(tmp_path / "ds")]) == 0
    m = pixfeed.open_dataset(tmp_path / "ds").manifest
    assert m["classes"] == ["zebra", "aardvark"] and labels_of(tmp_path / "ds") == [1, 0, -1]
    (tmp_path / "data" / "shards").mkdir()
    shard(tmp_path / "data" / "shards" / "s.tar", [("a", 2), ("b", 0)])
    m = pixfeed.pack(tmp_path / "data" / "shards", tmp_path / "wds", "mmap", workers=1,
                     class_names=tmp_path / "data" / "names.json")
    assert m["classes"] == ["zebra", "aardvark", "moth"] and labels_of(tmp_path / "wds") == [2, 0]
    m = pixfeed.pack_samples([{"image": jpeg(0), "label": 1}], tmp_path / "py", workers=1, class_names=["x", "y"])
    assert m["classes"] == ["x", "y"]
    with pytest.raises(SourceError, match=r"--class-names .*names\.txt: 2 class names, but a sample has label 2"):
        pixfeed.pack(tmp_path / "data" / "shards", tmp_path / "bad", "mmap", workers=1,
                     class_names=tmp_path / "data" / "names.txt")
    (tmp_path / "data" / "n.csv").write_text("image,label\nimg/a.png,cat\n")
    with pytest.raises(OptionError, match=r"--class-names names integer labels, .*'cat', a class name"):
        pack_index(tmp_path / "data" / "n.csv", tmp_path / "bad", class_names=["x"])
    with pytest.raises(OptionError, match=r"--class-names applies to an index file or WebDataset shards"):
        pixfeed.pack(tmp_path / "data" / "img", tmp_path / "bad", "mmap", class_names=["x"])
    (tmp_path / "data" / "dup.txt").write_text("a\nb\na\n")
    with pytest.raises(OptionError, match=r"names 'a' twice"):
        pack_index(tmp_path / "data" / "i.csv", tmp_path / "bad", class_names=tmp_path / "data" / "dup.txt")
    assert not (tmp_path / "bad").exists()


# --- 5: embedded images that share a file name -------------------------------------------------------------------

def test_embedded_images_of_one_file_name_are_keyed_by_row(tmp_path):
    """cats/000.jpg and dogs/000.jpg are both 000.jpg once embedded: "row 1 and row 0 name the same image key"."""
    paths = images(tmp_path / "data" / "img", ["cats/000.png", "dogs/000.png", "dogs/001.png"])
    index = hf_parquet(tmp_path / "data" / "train.parquet", {"image": paths, "label": [0, 1, 1]},
                       {"image": "image", "label": ("label", ["cat", "dog"])})
    m = pack_index(index, tmp_path / "ds", store="pixels", size=8)
    ds = open_dataset(tmp_path / "ds")
    assert ds.keys() == ["000~row0", "000~row1", "001"] and m["classes"] == ["cat", "dog"]
    assert not np.array_equal(ds[0][0], ds[1][0])


def test_rows_of_one_file_are_still_refused_saying_so(tmp_path):
    images(tmp_path / "data" / "img", ["a.png", "a.jpg"])
    (tmp_path / "data" / "i.csv").write_text("image\nimg/a.png\nimg/a.jpg\n")  # two files, one key: keyed by row
    pack_index(tmp_path / "data" / "i.csv", tmp_path / "ds")
    assert open_dataset(tmp_path / "ds").keys() == ["img/a~row0", "img/a~row1"]
    (tmp_path / "data" / "j.csv").write_text("image\nimg/a.png\nimg/a.png\n")
    with pytest.raises(SourceError, match=r"line 3 and line 2 name the same image key 'img/a': both name the file"):
        pack_index(tmp_path / "data" / "j.csv", tmp_path / "bad")


# --- 9: what SRC means for an index --------------------------------------------------------------------------------

def test_path_only_parquet_keys_are_relative_to_src(tmp_path):
    """Dataset.to_parquet writes absolute paths: keys were the whole path, SRC ignored."""
    paths = images(tmp_path / "data" / "photos", ["n01440764/tench_1.png", "n01443537/goldfish_1.png"])
    index = hf_parquet(tmp_path / "data" / "train.parquet", {"image": paths, "label": [0, 1]},
                       {"image": "image", "label": ("label", ["tench", "goldfish"])}, embed=False)
    m = pack_index(index, tmp_path / "ds", src=tmp_path / "data" / "photos", allow_outside_src=True)
    assert open_dataset(tmp_path / "ds").keys() == ["n01440764/tench_1", "n01443537/goldfish_1"]
    assert m["classes"] == ["tench", "goldfish"]


def test_an_index_of_bytes_needs_no_src(tmp_path, capsys):
    paths = images(tmp_path / "data" / "img", ["a.png", "b.png"])
    index = hf_parquet(tmp_path / "data" / "train.parquet", {"image": paths, "caption": ["x", "y"]},
                       {"image": "image", "caption": "string"})
    assert cli(["pack", "-q", "--workers", "1", "--index", str(index), str(tmp_path / "ds")]) == 0
    assert open_dataset(tmp_path / "ds").keys() == ["a", "b"]
    m = pack_index(index, tmp_path / "ds2", src=tmp_path / "data" / "gone")  # a SRC that is not there: not needed
    assert m["count"] == 2
    (tmp_path / "data" / "i.csv").write_text("image\nimg/a.png\n")
    with pytest.raises(SourceError, match=r"i\.csv: line 2 names the file 'img/a\.png'; give SRC"):
        pack_index(tmp_path / "data" / "i.csv", tmp_path / "bad", src=None)
    with pytest.raises(SourceError, match=r"source .*gone: no such folder \(the index's paths are relative to it"):
        pack_index(tmp_path / "data" / "i.csv", tmp_path / "bad", src=tmp_path / "data" / "gone")
    assert cli(["pack", str(tmp_path / "data" / "img")]) == 2
    assert "give the source and the destination" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_a_dst_inside_src_is_no_class_folder_for_an_index(tmp_path):
    """An index scans nothing in SRC: a DST inside it was refused "where the next scan would find it (as a
    class folder)", which never happens; a folder source still refuses it, for that reason."""
    images(tmp_path / "src", ["img/a.png", "img/b.png"])
    (tmp_path / "i.csv").write_text("image\nimg/a.png\nimg/b.png\n")
    m = pack_index(tmp_path / "i.csv", tmp_path / "src" / "packed", src=tmp_path / "src")
    assert m["count"] == 2 and open_dataset(tmp_path / "src" / "packed").keys() == ["img/a", "img/b"]
    m = pack_index(tmp_path / "i.csv", tmp_path / "src" / "packed", src=tmp_path / "src", overwrite=True)
    assert m["count"] == 2 and sorted(p.name for p in (tmp_path / "src" / "img").iterdir()) == ["a.png", "b.png"]
    with pytest.raises(OptionError, match=r"inside the source .* \(as a class folder\)"):
        pixfeed.pack(tmp_path / "src" / "img", tmp_path / "src" / "img" / "packed", "mmap", workers=1)
