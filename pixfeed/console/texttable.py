"""Plain-text tables (Markdown pipe tables) for reports that several tools print."""
from __future__ import annotations

from typing import List, Sequence

from .words import printable


def table(head: Sequence[str], rows: List[List[str]]) -> List[str]:
    """The lines of a table with columns as wide as their widest cell; a cell's control characters (a
    newline from a file name in a finding) are escaped, so no cell adds a line or moves the cursor."""
    head, rows = [printable(c) for c in head], [[printable(c) for c in row] for row in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]
