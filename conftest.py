"""How the code blocks of README.md and docs/*.md run (collected by pytest-codeblocks, ``--codeblocks``
in pyproject's addopts; the convention is in docs/README.md).

* Each page's blocks run in order, in one temporary folder of the page's own, never in the
  repository: what one block writes (``pixfeed sample data --count 20``) the next ones read.
* The folder links ``examples/``, ``scripts/`` and ``benchmarks/`` of this checkout, so a command
  written as a user types it at a clone's root (``python examples/train.py``) runs as written.
* A ``bash`` block stops at its first failing command (``set -eo pipefail``), not only at its last.
* ``PIXFEED_CACHE`` points into the page's folder, so nothing lands in ``~/.cache``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
LINKED = ("examples", "scripts", "benchmarks")
_folders: dict = {}


def _is_block(item) -> bool:
    return type(item).__module__.startswith("pytest_codeblocks")


def _folder(page: Path) -> Path:
    if page not in _folders:
        folder = Path(tempfile.mkdtemp(prefix=f"pixfeed-docs-{page.stem}-"))
        for name in LINKED:
            (folder / name).symlink_to(ROOT / name, target_is_directory=True)
        _folders[page] = folder
    return _folders[page]


def pytest_collection_modifyitems(items):
    for item in items:
        if _is_block(item) and item.obj.syntax in ("bash", "sh"):
            item.obj.code = ("set -eo pipefail\n" if item.obj.syntax == "bash" else "set -e\n") + item.obj.code


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if not _is_block(item):
        yield
        return
    folder, cwd, cache = _folder(Path(item.path)), os.getcwd(), os.environ.get("PIXFEED_CACHE")
    os.chdir(folder)
    os.environ["PIXFEED_CACHE"] = str(folder / ".cache")
    try:
        outcome = yield
        failed = outcome.exception
        if isinstance(failed, subprocess.CalledProcessError):  # the plugin would report only the exit status
            outcome.force_exception(RuntimeError(
                f"{item.path.name}, {item.name}: exit status {failed.returncode} in {folder}\n{failed.cmd}\n"
                f"--- stdout\n{failed.stdout.decode(errors='replace')}\n--- stderr\n{failed.stderr.decode(errors='replace')}"))
    finally:
        os.chdir(cwd)
        if cache is None:
            os.environ.pop("PIXFEED_CACHE", None)
        else:
            os.environ["PIXFEED_CACHE"] = cache


def pytest_sessionfinish(session):
    for folder in _folders.values():
        shutil.rmtree(folder, ignore_errors=True)
    _folders.clear()
