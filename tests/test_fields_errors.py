"""Bad index files and fields: each a clear error naming the file, row and column; nothing left behind."""
from __future__ import annotations

import csv
import json

import pytest

import pixfeed
from fieldtree import make_field_tree
from pixfeed.errors import OptionError, SourceError

CSV_FIELDS = ("boxes:boxes", "mask:mask")


@pytest.fixture
def tree(tmp_path):
    return make_field_tree(tmp_path / "src", 4)


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(header)
        out.writerows(rows)
    return path


def pack(tree, index, dst, **kw):
    kw.setdefault("workers", 1)
    return pixfeed.pack(tree, dst, "mmap", store="encoded", index=str(index), **kw)


def nothing_left(dst) -> bool:
    return not dst.exists() and not list(dst.parent.glob(f".{dst.name}.pixfeed-*"))


def test_a_missing_image_follows_on_error(tree, tmp_path):
    index = write_csv(tmp_path / "i.csv", ["image", "caption"], [["img/00.png", "a"], ["img/nope.png", "b"]])
    with pytest.raises(SourceError, match=r"i\.csv: line 3 \(img/nope\.png\).*cannot read"):
        pack(tree, index, tmp_path / "ds")
    assert nothing_left(tmp_path / "ds")
    m = pack(tree, index, tmp_path / "ds", on_error="skip")
    assert m["count"] == 1 and "line 3" in m["skipped"][0]["reason"]


def test_a_missing_mask_follows_on_error(tree, tmp_path):
    index = write_csv(tmp_path / "i.csv", ["image", "mask"], [["img/00.png", "masks/00.png"], ["img/01.png", "masks/x.png"]])
    with pytest.raises(SourceError, match=r"i\.csv: line 3, column 'mask': masks/x\.png: cannot read"):
        pack(tree, index, tmp_path / "ds", field=["mask:mask"])
    assert nothing_left(tmp_path / "ds")
    assert pack(tree, index, tmp_path / "ds", field=["mask:mask"], on_error="skip")["count"] == 1


@pytest.mark.parametrize("rows, field, match", [
    ([["img/00.png", "3"], ["img/01.png", "x"]], "n:int", r"line 3, column 'n': 'x' is not an integer"),
    ([["img/00.png", "1.5"]], "n:int", r"line 2, column 'n': '1.5' is not an integer"),
    ([["img/00.png", "[1, 2, 3]"], ["img/01.png", "[1, 2]"]], "n:float32[3]",
     r"line 3, column 'n': an array of shape \[2\] does not fit field n float32\[3\]"),
    ([["img/00.png", "[[1, 2], [3]]"]], "n:float32[N,2]", r"line 2, column 'n': .* is not a regular array"),
    ([["img/00.png", "{oops"]], "n:json", r"line 2, column 'n': not valid JSON"),
    ([["img/00.png", ""]], "n:int", r"line 2, column 'n': empty cell for field n \(int\), which has no missing "
                                    r"value; .*--fill n=VALUE"),  # a float's empty cell is NaN (data-rules.md)
])
def test_a_bad_cell_is_named(tree, tmp_path, rows, field, match):
    index = write_csv(tmp_path / "i.csv", ["image", "n"], rows)
    with pytest.raises(SourceError, match=match):
        pack(tree, index, tmp_path / "ds", field=[field])
    assert nothing_left(tmp_path / "ds")


def test_unknown_field_types_and_columns(tree, tmp_path):
    index = write_csv(tmp_path / "i.csv", ["image", "n"], [["img/00.png", "3"]])
    with pytest.raises(OptionError, match=r"--field n:complex64\[2\]: unknown field type; expected one of int"):
        pack(tree, index, tmp_path / "ds", field=["n:complex64[2]"])
    with pytest.raises(OptionError, match=r"--field m: .* has no column 'm'; its columns: image, n"):
        pack(tree, index, tmp_path / "ds", field=["m:int"])
    with pytest.raises(OptionError, match="--field 'n=int': expected NAME:TYPE"):
        pack(tree, index, tmp_path / "ds", field=["n=int"])
    with pytest.raises(OptionError, match="--class-column applies to an index file source only"):
        pixfeed.pack(tree, tmp_path / "ds", "mmap", class_column="label")
    with pytest.raises(OptionError, match="--image-column 'picture': .* no such column"):
        pack(tree, index, tmp_path / "ds", image_column="picture")
    assert nothing_left(tmp_path / "ds")


def test_non_utf8_text_is_named(tree, tmp_path):
    (tmp_path / "i.csv").write_bytes(b"image,caption\nimg/00.png,ok\nimg/01.png,caf\xe9\n")
    with pytest.raises(SourceError, match=r"i\.csv: line 3: not valid UTF-8"):
        pack(tree, tmp_path / "i.csv", tmp_path / "ds")
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"image": ["img/00.png"], "caption": [b"caf\xe9"]}), tmp_path / "i.parquet")
    with pytest.raises(SourceError, match=r"i\.parquet: row 0, column 'caption': not valid UTF-8"):
        pack(tree, tmp_path / "i.parquet", tmp_path / "ds", field=["caption:str"])


def test_duplicate_keys_and_bad_image_columns(tree, tmp_path):
    index = write_csv(tmp_path / "i.csv", ["path", "n"], [["img/00.png", "1"], ["img/01.png", "2"], ["img/00.png", "3"]])
    with pytest.raises(SourceError, match=r"line 4 and line 2 name the same image key 'img/00'"):
        pack(tree, index, tmp_path / "ds")
    (tmp_path / "j.jsonl").write_text(json.dumps({"image": 3, "n": 1}) + "\n")
    with pytest.raises(SourceError, match=r"j\.jsonl: line 1, column 'image': 3 is neither an image path nor image bytes"):
        pack(tree, tmp_path / "j.jsonl", tmp_path / "ds")
    write_csv(tmp_path / "k.csv", ["name", "n"], [["img/00.png", "1"]])
    with pytest.raises(OptionError, match=r"k\.csv: no image column .* --image-column, one of: name, n"):
        pack(tree, tmp_path / "k.csv", tmp_path / "ds")
    assert nothing_left(tmp_path / "ds")


def test_a_mask_of_another_size_names_both(tree, tmp_path):
    index = write_csv(tmp_path / "i.csv", ["image", "mask"], [["img/00.png", "masks/01.png"]])  # 00 is 48x64, 01 64x48
    with pytest.raises(SourceError, match=r"column 'mask'.*the mask is 64x48 but its image .*img/00\.png\) is 48x64"):
        pack(tree, index, tmp_path / "ds", field=["mask:mask"])
    assert nothing_left(tmp_path / "ds")


def test_per_box_rows_must_match_the_boxes(tree, tmp_path):
    index = write_csv(tmp_path / "i.csv", ["image", "boxes", "cls"], [["img/00.png", "[[1, 2, 9, 9]]", "[0, 1]"]])
    with pytest.raises(SourceError, match=r"column 'cls': 2 rows, but field boxes has 1 boxes"):
        pack(tree, index, tmp_path / "ds", field=["boxes:boxes", "cls:int64[N]"], per_box="cls")
    with pytest.raises(OptionError, match="--per-box cls: needs exactly one boxes field"):
        pack(tree, index, tmp_path / "ds", field=["cls:int64[N]"], per_box="cls")


def test_cli_errors_are_one_line(tree, tmp_path, capsys):
    index = write_csv(tmp_path / "i.csv", ["image", "n"], [["img/00.png", "x"]])
    from pixfeed.cli import main
    assert main(["pack", "-q", "--index", str(index), "--field", "n:int", str(tree), str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "line 2, column 'n'" in err[0]


def test_a_csv_column_of_text_and_numbers_is_text_as_written(tree, tmp_path):
    """Codes such as 001 and A12 in one CSV column are text, kept as written (not JSON, not 1)."""
    index = write_csv(tmp_path / "i.csv", ["image", "code"], [["img/00.png", "001"], ["img/01.png", "A12"]])
    m = pack(tree, index, tmp_path / "ds")
    assert m["schema"] == [{"name": "code", "type": "str"}]
    ds = pixfeed.open_dataset(tmp_path / "ds", fields=("code",))
    assert [ds[i][0] for i in range(2)] == ["001", "A12"]


def test_a_jsonl_column_of_two_types_names_both_rows(tree, tmp_path):
    index = tmp_path / "i.jsonl"
    index.write_text('{"image": "img/00.png", "n": 1}\n{"image": "img/01.png", "n": "x"}\n')
    with pytest.raises(SourceError, match=r"field 'n': its values are of different types, 1 in .*i\.jsonl: line 1 "
                                          r"and 'x' in .*i\.jsonl: line 2; .*--field n:TYPE"):
        pack(tree, index, tmp_path / "ds")
    assert nothing_left(tmp_path / "ds")
    assert pack(tree, index, tmp_path / "ds", field=["n:json"])["count"] == 2


def test_class_indices_in_the_class_column_stay_as_they_are(tree, tmp_path):
    """Integer labels (digits in a CSV, ints in JSONL) are class indices already: label 10 stays 10, not
    the third of the sorted names "0", "1", "10"; names are sorted as before, and so is a mix."""
    rows = [[f"img/{i:02d}.png", str(label)] for i, label in enumerate([10, 1, 0, 2])]
    m = pack(tree, write_csv(tmp_path / "i.csv", ["image", "label"], rows), tmp_path / "ds")
    ds = pixfeed.open_dataset(tmp_path / "ds")
    assert [ds[i][1] for i in range(4)] == [10, 1, 0, 2] and m["classes"] == [str(c) for c in range(11)]
    jsonl = tmp_path / "i.jsonl"
    jsonl.write_text("".join(json.dumps({"image": f"img/{i:02d}.png", "label": v}) + "\n"
                             for i, v in enumerate([3, "b", "a", 3])))
    m = pack(tree, jsonl, tmp_path / "ds2")
    ds = pixfeed.open_dataset(tmp_path / "ds2")
    assert m["classes"] == ["3", "a", "b"] and [ds[i][1] for i in range(4)] == [0, 2, 1, 0]
