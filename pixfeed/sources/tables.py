"""Reading an index file into columns: CSV and JSONL with the standard library, Parquet with pyarrow.

``read_table(path)`` returns (columns {name: [cell, ...]}, row names for
messages, whether the cells are text to parse (CSV) or typed values);
``hf_class_names`` the names of a Hugging Face Parquet's ``ClassLabel`` columns.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Dict, List, Tuple

from ..errors import OptionError, SourceError

SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


def read_table(path: Path, data: bytes) -> Tuple[Dict[str, list], List[str], bool]:
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise OptionError(f"--index {path}: unknown index file type {path.suffix!r}; expected "
                          f"{', '.join(SUFFIXES)}")
    return {"csv": _csv, "jsonl": _jsonl, "parquet": _parquet}[kind](path, data)


def _csv(path: Path, data: bytes):
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise SourceError(f"{path}: line {line}: not valid UTF-8 ({e.reason}); save the index as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
    try:
        header = next(reader)
    except StopIteration:
        raise SourceError(f"{path}: empty index file (no header row)") from None
    columns: Dict[str, list] = {name: [] for name in header}
    if len(columns) != len(header):
        raise SourceError(f"{path}: the header names a column twice ({', '.join(header)})")
    rows = []
    for cells in reader:
        if not cells:
            continue
        if len(cells) != len(header):
            raise SourceError(f"{path}: line {reader.line_num}: {len(cells)} cells, but the header has "
                              f"{len(header)} columns")
        for name, cell in zip(header, cells):
            columns[name].append(cell)
        rows.append(f"line {reader.line_num}")
    return columns, rows, True


def _jsonl(path: Path, data: bytes):
    columns: Dict[str, list] = {}
    rows = []
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (UnicodeDecodeError, ValueError) as e:
            raise SourceError(f"{path}: line {n}: not a JSON object ({e})") from None
        if not isinstance(row, dict):
            raise SourceError(f"{path}: line {n}: a row must be a JSON object, not {type(row).__name__}")
        for name in row.keys() - columns.keys():
            columns[name] = [None] * len(rows)
        for name, cells in columns.items():
            cells.append(row.get(name))
        rows.append(f"line {n}")
    return columns, rows, False


def hf_class_names(path: Path, data: bytes) -> Dict[str, List[str]]:
    """{column: class names} of the Hugging Face ``ClassLabel`` columns of a Parquet file, from the
    ``huggingface`` key of its Arrow schema metadata (``{"info": {"features": {COLUMN: {"_type":
    "ClassLabel", "names": [...]}}}}``, as ``datasets`` writes it); {} for other files and metadata."""
    if SUFFIXES.get(path.suffix.lower()) != "parquet":
        return {}
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        meta = pq.read_schema(pa.BufferReader(data)).metadata or {}
        features = json.loads(meta.get(b"huggingface", b"{}")).get("info", {}).get("features", {})
    except Exception:  # noqa: BLE001 - metadata beside a table read already: unreadable metadata names nothing
        return {}
    if not isinstance(features, dict):
        return {}
    return {column: [str(n) for n in f["names"]] for column, f in features.items()
            if isinstance(f, dict) and f.get("_type") == "ClassLabel" and isinstance(f.get("names"), list)}


def _parquet(path: Path, data: bytes):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise OptionError(f"--index {path}: reading Parquet needs pyarrow: pip install 'pixfeed[parquet]'") from None
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"{path}: not a readable Parquet file ({e})") from None
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    return columns, [f"row {i}" for i in range(table.num_rows)], False
