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

from ..errors import OptionError, OverLimitError, SourceError
from ..storage.bounded import CELL_CHARS, CELLS, CELLS_BYTES, COLUMNS, MANIFEST_OBJECTS, SPARSE, loads

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
    limit = csv.field_size_limit(CELL_CHARS)  # csv's own 128 KiB stops long polygon and box lists
    try:
        return _csv_rows(path, reader)
    except csv.Error as e:
        if "field limit" in str(e):
            raise OverLimitError(f"{path}: line {reader.line_num}: a cell over pixfeed's limit of {CELL_CHARS:,} "
                                 "characters for one CSV cell") from None
        raise SourceError(f"{path}: line {reader.line_num}: not CSV ({e})") from None
    finally:
        csv.field_size_limit(limit)


def _csv_rows(path: Path, reader):
    try:
        header = next(reader)
    except StopIteration:
        raise SourceError(f"{path}: empty index file (no header row)") from None
    if len(header) > COLUMNS:
        raise OverLimitError(f"{path}: the header has {len(header):,} columns, over pixfeed's limit of {COLUMNS:,} "
                             "(each column becomes a field)")
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
    """Rows kept as read, the columns filled once at the end (time and memory linear in the table: a
    column that only some rows have was copied on every row before); a table more than SPARSE times
    larger than the cells its rows hold, or of more than COLUMNS columns, is an OverLimitError."""
    names: Dict[str, None] = {}
    parsed, rows, cells = [], [], 0
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = loads(line, f"{path}: line {n}")
        except (UnicodeDecodeError, ValueError) as e:
            if isinstance(e, OverLimitError):
                raise
            raise SourceError(f"{path}: line {n}: not a JSON object ({e})") from None
        if not isinstance(row, dict):
            raise SourceError(f"{path}: line {n}: a row must be a JSON object, not {type(row).__name__}")
        names.update(dict.fromkeys(row))
        parsed.append(row)
        rows.append(f"line {n}")
        cells += len(row)
        if len(names) > COLUMNS or len(names) * len(rows) > SPARSE * cells + (1 << 20):
            raise OverLimitError(f"{path}: line {n}: {len(names):,} columns over {len(rows):,} rows that hold "
                                 f"{cells:,} cells; pixfeed takes at most {COLUMNS:,} columns, and a table at most "
                                 f"{SPARSE} times larger than its cells (most columns missing from most rows)")
    columns = {name: [row.get(name) for row in parsed] for name in names}
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
        features = loads(meta.get(b"huggingface", b"{}"), path, MANIFEST_OBJECTS).get("info", {}).get("features", {})
    except Exception:  # noqa: BLE001 - metadata beside a table read already: unreadable metadata names nothing
        return {}
    if not isinstance(features, dict):
        return {}
    return {column: [str(n) for n in f["names"]] for column, f in features.items()
            if isinstance(f, dict) and f.get("_type") == "ClassLabel" and isinstance(f.get("names"), list)}


class _Cells:
    """What a Parquet index's cells may take (docs/untrusted-data.md, "Bounded work"), checked before a row
    group is read from its footer: the group's pages after decompression and the cells (rows x columns, each
    a Python object) at most CELLS beyond 16 a byte of the file; then, as each group is read, the bytes of
    its text (and nested values) at most CELLS_BYTES beyond 64 times the file's bytes (``add``).  A
    dictionary-encoded column repeats one value in every row: 843 bytes of Parquet held 2 GB of text.  A
    real index compresses well (10M rows of paths and labels: 13 MB), so the limits are on what one byte
    of the file may become, generously."""

    def __init__(self, path: Path, size: int, meta) -> None:
        self.path, self.size, self.text = path, size, 0
        groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
        self._check(max((g.total_byte_size for g in groups), default=0), CELLS_BYTES + 64 * size,
                    "one row group's pages take", "bytes")
        self._check(meta.num_rows * meta.num_columns, CELLS + 16 * size, "it holds", "cells")

    def add(self, nbytes: int) -> None:
        self.text += nbytes
        self._check(self.text, CELLS_BYTES + 64 * self.size, "its cells hold", "bytes of text")

    def _check(self, n: int, limit: int, what: str, unit: str) -> None:
        if n > limit:
            raise OverLimitError(f"{self.path}: {what} {n:,} {unit}, over pixfeed's limit of {limit:,} for an index "
                                 f"file of {self.size:,} bytes; the file repeats values far more than an index "
                                 "needs (docs/untrusted-data.md)")


def _is_text(pa, kind) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
        or pa.types.is_large_binary(kind)


def _text_bytes(pa, column) -> int:
    """The bytes of ``column``'s text cells as Python objects will hold them (a dictionary's value counted in
    every row that names it), and 8 x the Arrow bytes of a nested one (a list's items are objects too)."""
    import pyarrow.compute as pc

    total = 0
    for chunk in column.chunks:
        kind = chunk.type.value_type if pa.types.is_dictionary(chunk.type) else chunk.type
        if _is_text(pa, kind):
            values = pc.take(pc.binary_length(chunk.dictionary), chunk.indices) \
                if pa.types.is_dictionary(chunk.type) else pc.binary_length(chunk)
            total += int(pc.sum(values).as_py() or 0)
        elif pa.types.is_nested(kind):
            total += 8 * chunk.nbytes
    return total


def _parquet(path: Path, data: bytes):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise OptionError(f"--index {path}: reading Parquet needs pyarrow: pip install 'pixfeed[parquet]'") from None
    pool = pa.default_memory_pool()
    try:
        # one row group at a time, its Arrow memory freed before the next: the whole table in Arrow took
        # ~3x its bytes (read, decompressed, decoded) beside the Python cells; the pool's freed memory is
        # handed back to the system at the end (mimalloc and jemalloc keep it otherwise)
        f = pq.ParquetFile(pa.BufferReader(data))
        schema = f.schema_arrow
        text = [n for n, t in zip(schema.names, schema.types) if _is_text(pa, t)]
        f = pq.ParquetFile(pa.BufferReader(data), read_dictionary=text)  # repeated values stay shared in Arrow
        columns: Dict[str, list] = {name: [] for name in schema.names}
        cells = _Cells(path, len(data), f.metadata)
        for group in range(f.num_row_groups):
            table = f.read_row_group(group)
            cells.add(sum(_text_bytes(pa, table.column(name)) for name in table.column_names))
            for name in table.column_names:  # decoded once counted (a DictionaryArray's to_pylist is 10x slower)
                column = table.column(name)
                if pa.types.is_dictionary(column.type):
                    column = column.cast(column.type.value_type)
                columns[name] += column.to_pylist()
            del table
    except (pa.ArrowException, OSError) as e:
        raise SourceError(f"{path}: not a readable Parquet file ({e})") from None
    finally:
        getattr(pool, "release_unused", lambda: None)()
    n = len(next(iter(columns.values()), []))
    return columns, [f"row {i}" for i in range(n)], False
