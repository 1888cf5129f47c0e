"""Typed fields of a sample: the schema the manifest declares, and one codec module per kind.

A sample is its image plus any fields.  The manifest's ``"schema"`` lists
them in order, each ``{"name", "type"}`` plus ``"dtype"`` and ``"shape"`` for
arrays (``Field.to_json``).  Types (the ``NAME:TYPE`` of ``--field``):

    int, float            one int64 / float64 (``fields.scalar``)
    str, json, bytes      UTF-8 text, any JSON value (never pickle), raw bytes (``fields.text``)
    DTYPE[d0,d1,...]      an ndarray of a dtype in ``array.DTYPES``; d0 may be N, a variable
                          first dimension (``float32[N,4]``, ``int64[N]``, ``uint8[3,3]``)
    boxes                 float32[N,4] xyxy boxes in the oriented source image's pixels; they
                          follow the image's resize, crop and flip (``fields.array``)
    image, mask           a second RGB image (a depth map) / a single-channel label image,
                          stored losslessly and resized with nearest neighbour (``fields.picture``)

``label`` is not in the schema: it is the record's class index, as before (-1
for a flat source), and readers offer it as the field ``"label"`` beside
``"image"``.  Every field's stored bytes carry an xxh3_64 checksum, as the image's do.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from ..errors import OptionError

SCALARS = ("int", "float")
BLOBS = ("str", "json", "bytes")
PICTURES = ("image", "mask")
NAMED = (*SCALARS, *BLOBS, "boxes", *PICTURES)
BUILTIN = ("image", "label")  # what every record has; the default fields of a reader
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_ARRAY = re.compile(r"^([a-z0-9]+)\[([^\]]*)\]$")


@dataclass(frozen=True)
class Field:
    name: str
    type: str                                # a NAMED type or "ndarray"
    dtype: Optional[str] = None              # ndarray and boxes
    shape: Optional[Tuple[Optional[int], ...]] = None  # ndarray and boxes; None first: variable

    @property
    def spec(self) -> str:
        """The ``--field`` spelling of the type: ``float32[N,4]``, ``str``, ..."""
        if self.type != "ndarray":
            return self.type
        return f"{self.dtype}[{','.join('N' if d is None else str(d) for d in self.shape)}]"

    @property
    def variable(self) -> bool:
        """Whether an array's first dimension varies from record to record."""
        return self.shape is not None and len(self.shape) > 0 and self.shape[0] is None

    @property
    def geometric(self) -> bool:
        """Whether the field follows the image's resize, crop and flip."""
        return self.type in ("boxes", *PICTURES)

    def to_json(self) -> dict:
        out = {"name": self.name, "type": self.type}
        if self.dtype is not None:
            out.update(dtype=self.dtype, shape=[d for d in self.shape])
        return out


NAME_RULE = ("a field name is letters, digits, '_' and '-' (not starting with a digit), and not "
             f"{' or '.join(BUILTIN)}, which every record has; field names become file names in a dataset")


def check_name(name, what: str, fix: str = "rename it") -> str:
    """``name`` if it may name a field (the name rule, NAME_RULE), else UnsafeNameError naming ``what``
    (the index file and column, the shard member, the sample key): checked where a name enters, as a
    name like ``../x`` would become a file outside the dataset."""
    from ..errors import UnsafeNameError

    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in BUILTIN:
        raise UnsafeNameError(f"{what} {name!r} cannot be a field name: {NAME_RULE}; {fix}")
    return name


def parse_type(name: str, spec: str, where: str = "--field") -> Field:
    """The Field ``name`` of type ``spec`` (``int``, ``float32[N,4]``, ...); OptionError otherwise."""
    from .array import DTYPES

    if not _NAME.match(name or "") or name in BUILTIN:
        raise OptionError(f"{where} {name!r}: a field name is letters, digits, '_' and '-' (not starting with a "
                          f"digit), and not {' or '.join(BUILTIN)}, which every record has")
    spec = spec.strip()
    if spec == "boxes":
        return Field(name, "boxes", "float32", (None, 4))
    if spec in NAMED:
        return Field(name, spec)
    m = _ARRAY.match(spec)
    if m and m.group(1) in DTYPES:
        dims = [d.strip() for d in m.group(2).split(",")] if m.group(2).strip() else []
        try:
            shape = tuple(None if d == "N" and k == 0 else int(d) for k, d in enumerate(dims))
        except ValueError:
            shape = None
        if shape is not None and all(d is None or d > 0 for d in shape):
            return Field(name, "ndarray", m.group(1), shape)
    raise OptionError(f"{where} {name}:{spec}: unknown field type; expected one of {', '.join(NAMED)} or an "
                      f"array DTYPE[d0,...] with DTYPE in {', '.join(DTYPES)} and d0 an integer or N "
                      "(e.g. float32[N,4], int64[N], uint8[3,3])")


def parse_field_option(text: str) -> Tuple[str, str]:
    """``--field NAME:TYPE`` -> (NAME, TYPE)."""
    name, sep, spec = text.partition(":")
    if not sep or not name or not spec:
        raise OptionError(f"--field {text!r}: expected NAME:TYPE, e.g. caption:str or boxes:float32[N,4]")
    return name.strip(), spec.strip()


def from_json(items, where: object) -> List[Field]:
    """The schema of a manifest (``"schema"``; absent in datasets packed before fields existed)."""
    from ..errors import DatasetError

    if items is None:
        return []
    fields = []
    try:
        for item in items:
            f = parse_type(item["name"], item["type"] if item["type"] != "ndarray" else
                           f"{item['dtype']}[{','.join('N' if d is None else str(d) for d in item['shape'])}]")
            fields.append(f)
    except (TypeError, KeyError, OptionError) as e:
        raise DatasetError(f"{where}: the manifest's \"schema\" is damaged ({e})") from None
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise DatasetError(f"{where}: the manifest's \"schema\" names a field twice")
    return fields


def select(requested: Optional[Sequence[str]], schema: Sequence[Field], where: object) -> Optional[Tuple[str, ...]]:
    """The fields a reader returns: a tuple of names (checked), or None for a dict of every field."""
    if requested is None:
        return None
    if isinstance(requested, str):
        requested = (requested,)
    have = [*BUILTIN, *(f.name for f in schema)]
    missing = [n for n in requested if n not in have]
    if missing or not requested:
        raise OptionError(f"{where}: fields={tuple(requested)!r}: no field {', '.join(map(repr, missing)) or '()'}; "
                          f"this dataset has {', '.join(have)}")
    return tuple(requested)


def per_box_fields(schema: List[Field], names: Sequence[str]) -> tuple:
    """``--per-box NAMES`` checked against ``schema``: one boxes field, and each name an array with a row per box."""
    if not names:
        return ()
    boxes = [f for f in schema if f.type == "boxes"]
    if len(boxes) != 1:
        raise OptionError(f"--per-box {','.join(names)}: needs exactly one boxes field (--field NAME:boxes), "
                          f"found {len(boxes)}")
    by_name = {f.name: f for f in schema}
    for n in names:
        if n not in by_name or not by_name[n].variable:
            raise OptionError(f"--per-box {n}: must name an array field with a variable first dimension "
                              f"(e.g. --field {n}:int64[N]), one row per box")
    return tuple(names)
