"""Samples from Python as a source: ``pixfeed.pack_samples`` (anything else people hold: COCO, a database).

``pack_samples(samples, DST)``: ``samples`` is an iterable of dicts, one per
sample: ``"image"`` (a file path, the image file's bytes, a PIL image, or an
HxWx3 or HxW uint8 array, the last two stored as a lossless PNG), optional ``"label"`` (a class index,
-1 for unlabelled, named by ``class_names=`` or "0".."max"; or a class name: names are mapped to sorted
indices as folder names are) and
``"key"`` (default: the sample's number, ``000000012``), and any other keys
as typed fields, their types inferred as an index file's columns are
(``sources/infer.py``) unless ``schema={"boxes": "boxes", "mask": "mask"}``
says; a ``mask`` or ``image`` field takes a path, bytes or an array too.

``pack_samples(fn, DST, inputs=[...])``: ``fn(input)`` yields such dicts;
the inputs run on the pack's executor, one input a task (``Executor.map``:
``workers`` forked processes, or threads when the calling process already runs
threads, where a fork could copy a held lock; Ray tasks with
``executor="ray"``, ``fn`` sent by cloudpickle), a raising
``fn`` names its input and follows ``on_error``; then the samples are packed
as from an iterable.  Every sample's image is held in memory as encoded bytes
until the pack is written: for sources larger than memory, write an index
file or WebDataset shards and pack those.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np
from PIL import Image

from ..errors import OptionError, SourceError
from ..storage.bounded import IMAGE_BYTES, int64, read_file
from ..fields import Field, check_name, parse_type
from ..fields.codec import parse
from ..fields.picture import encode_mask, encode_png
from .folder import Source
from .infer import UNLABELLED, check_labels, id_classes, infer, label_int, read_class_names, unlabelled_note

RESERVED = ("image", "label", "key")


class SampleSource(Source):
    """Samples given in Python; messages name the sample (and the input it came from)."""
    names: List[str] = []

    def where(self, i: int) -> str:
        return self.names[i]


def from_inputs(fn: Callable, inputs: Sequence, executor, on_error: str) -> tuple:
    """(samples, their names, notes): ``fn`` run over ``inputs`` on ``executor`` (``Executor.map``:
    forked processes, threads or Ray tasks), inside ``with executor:``."""
    items = list(enumerate(inputs))
    results = executor.map(lambda item: _run(fn, item), items)
    samples, names, notes = [], [], []
    for (n, value), (made, error) in zip(items, results):
        if error is not None:
            message = f"input {n} ({shown(value)}): {function_name(fn)} raised {error}"
            if on_error == "fail":
                raise SourceError(message)
            notes.append(f"skipped: {message}")
            continue
        samples += made
        names += [f"input {n} ({shown(value)}), sample {k}" for k in range(len(made))]
    return samples, names, notes


SHOWN = 120  # characters of an input's repr a message shows


def shown(value) -> str:
    """An input's repr for messages: whole up to SHOWN characters; a longer one cut after its last whole item
    (at a ", ") within them and marked, never inside a value (a cut ``'width': 500`` read as ``'width': 5``)."""
    text = repr(value)
    if len(text) <= SHOWN:
        return text
    cut = text.rfind(", ", 0, SHOWN)
    return f"{text[:cut] if cut > 0 else text[:SHOWN]}, ... ({len(text):,} characters in all)"


def function_name(fn: Callable) -> str:
    """A function's name, or a callable object's class name, for messages and the manifest."""
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _run(fn: Callable, item) -> tuple:
    """``fn(input)``'s samples, pictures as bytes, or the error it raised."""
    try:
        return [_portable(s) for s in fn(item[1])], None
    except Exception as e:  # noqa: BLE001 - the user's function: named, then on_error
        return [], f"{type(e).__name__}: {e}"


def _portable(sample) -> dict:
    """A sample dict with arrays that are pictures turned into PNG bytes (they cross processes as bytes)."""
    if not isinstance(sample, dict):
        raise SourceError(f"a sample must be a dict with an 'image', not {type(sample).__name__}")
    return {k: _picture(v) if k == "image" else v for k, v in sample.items()}


def _picture(value):
    """A uint8 array (HxW, HxWx3, HxWx4) or a PIL image as lossless PNG bytes; anything else as it is."""
    if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim in (2, 3) or \
            isinstance(value, Image.Image):
        return encode_png(value)
    return value


def scan_samples(samples: Iterable[dict], names: Optional[List[str]] = None, schema: Optional[Dict[str, str]] = None,
                 origin: Optional[dict] = None, class_names=None) -> SampleSource:
    samples = [_portable(s) for s in samples]
    names = names or [f"sample {n}" for n in range(len(samples))]
    if not samples:
        raise SourceError("pack_samples: no samples")
    for n, s in enumerate(samples):
        if "image" not in s:
            raise SourceError(f"{names[n]}: no 'image' (a path, the file's bytes or an HxWx3 uint8 array); its keys: "
                              f"{', '.join(map(str, s)) or 'none'}")
    blobs = [_image_bytes(s["image"], names[n]) for n, s in enumerate(samples)]
    keys = [str(s.get("key", f"{n:09d}")) for n, s in enumerate(samples)]
    dup = len(set(keys)) != len(keys) and next(k for k in keys if keys.count(k) > 1)
    if dup:
        raise SourceError(f"pack_samples: two samples of key {dup!r}; keys must be unique")
    labels, classes, note = _labels([s.get("label") for s in samples], names, class_names)
    fields = _schema(samples, names, schema or {})
    src = SampleSource(Path("."), keys, keys, labels, classes, np.array([len(b) for b in blobs], np.int64))
    src.names, src.blobs, src.schema, src.walked = names, blobs, fields, False
    src.values = {f.name: [_value(f, s[f.name], f"{names[n]}, field {f.name}") for n, s in enumerate(samples)]
                  for f in fields}
    src.origin = origin or {"kind": "python"}
    src.notes += [note] if note else []
    return src


def _image_bytes(value, where: str) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (str, Path)):
        try:
            return read_file(value, IMAGE_BYTES, f"{where}: image {value}")
        except OSError as e:
            raise SourceError(f"{where}: image {value}: cannot read ({e.strerror or e})") from None
    what = f"a {value.dtype} array of shape {value.shape}" if isinstance(value, np.ndarray) else \
        f"a {type(value).__name__}"
    raise SourceError(f"{where}: image is {what}; give a path, the file's bytes, a PIL image or an HxWx3 (or HxW) "
                      "uint8 array")


def _labels(values: list, names: List[str], class_names=None) -> tuple:
    """(labels, classes, note): class names mapped to sorted indices, or class indices kept as they are
    (-1 for unlabelled; their classes ``class_names``, else "0".."max"), as every source's labels are."""
    given = [v for v in values if v is not None]
    class_names = read_class_names(class_names, "class_names")
    if not given:
        return np.full(len(values), UNLABELLED, np.int64), id_classes([], class_names, "class_names"), None
    if len(given) != len(values):
        missing = next(n for n, v in enumerate(values) if v is None)
        raise SourceError(f"{names[missing]}: no 'label' while other samples have one; every sample needs one "
                          "(-1 for unlabelled), or none")
    ints = [None if isinstance(v, str) else label_int(v) for v in values]
    for n, i in enumerate(ints):  # named before any int64 array is made (#39)
        if i is not None:
            int64(i, names[n], "label")
    if all(isinstance(v, str) or i == UNLABELLED for v, i in zip(values, ints)) and \
            any(isinstance(v, str) for v in values):
        if class_names is not None:
            raise OptionError("class_names= names integer labels, and these samples' labels are class names "
                              f"({next(v for v in values if isinstance(v, str))!r}); leave class_names out")
        classes = sorted({v for v in values if isinstance(v, str)})
        number = {c: k for k, c in enumerate(classes)}
        labels = np.array([UNLABELLED if i == UNLABELLED else number[v] for v, i in zip(values, ints)], np.int64)
        return labels, classes, unlabelled_note(labels, "pack_samples: label")
    if all(i is not None for i in ints):
        labels = np.array(ints, np.int64)
        check_labels(labels, lambda n: names[n])
        return labels, id_classes(labels, class_names, "class_names"), unlabelled_note(labels, "pack_samples: label")
    text = next((n for n, v in enumerate(values) if isinstance(v, str)), None)
    index = next((n for n, i in enumerate(ints) if i is not None and i != UNLABELLED), None)
    if text is not None and index is not None:
        raise SourceError(f"{names[text]}: label {values[text]!r} is a class name and {names[index]}'s "
                          f"{values[index]!r} a class index; give every sample a name, or every one an index")
    bad = next(n for n, v in enumerate(values) if not isinstance(v, str) and ints[n] is None)
    raise SourceError(f"{names[bad]}: label {values[bad]!r} is neither a class index (int >= 0, or -1 for "
                      "unlabelled) nor a class name")


def _schema(samples: List[dict], names: List[str], given: Dict[str, str]) -> List[Field]:
    fields = [k for k in samples[0] if k not in RESERVED]
    for k in fields:
        check_name(k, f"{names[0]}: key", "rename the key")
    for n, s in enumerate(samples):
        extra = sorted(set(s) - set(fields) - set(RESERVED)) or sorted(set(fields) - set(s))
        if extra:
            raise SourceError(f"{names[n]}: fields {', '.join(sorted(set(s) - set(RESERVED)))} differ from the first "
                              f"sample's ({', '.join(fields) or 'none'}); every sample has the same fields")
    unknown = [k for k in given if k not in fields]
    if unknown:
        raise OptionError(f"schema: no sample has a field {unknown[0]!r}; the fields: {', '.join(fields) or 'none'}")
    return [parse_type(k, given[k], "schema") if k in given else
            infer(k, [_listed(s[k]) for s in samples], is_text=False, where=names) for k in fields]


def _listed(value):
    """NumPy arrays and scalars (np.float32(0.5), np.int64(3)) as the Python values they hold."""
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else value


def _value(f: Field, value, where: str):
    if isinstance(value, Image.Image) and f.type in ("mask", "image"):
        value = np.asarray(value)
    if f.type == "mask" and isinstance(value, np.ndarray):
        return encode_mask(value)
    if f.type == "image" and isinstance(value, np.ndarray):
        return encode_png(value)
    if f.type in ("mask", "image") and isinstance(value, Path):
        value = str(value)
    return parse(f, _listed(value) if f.type not in ("ndarray", "boxes") else value, where,
                 fix=f"give every sample a value, or keep None with schema={{{f.name!r}: 'json'}}")
