"""Warnings that point at the user's line: the first frame outside pixfeed, however deep the call
(``make_loader`` -> ``build_loader`` -> ``plan_loader`` ...), rather than a fixed ``stacklevel``
that every new layer of calls would move."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

from .words import printable

PACKAGE = str(Path(__file__).resolve().parent.parent)


def warn_caller(message: str, category: type = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the innermost caller outside pixfeed, its control
    characters escaped (``words.printable``)."""
    level, frame = 2, sys._getframe(1)  # stacklevel 1 is this function, 2 its caller
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(PACKAGE):
        level, frame = level + 1, frame.f_back
    warnings.warn(printable(message), category, stacklevel=level)  # a name from input forges no line
