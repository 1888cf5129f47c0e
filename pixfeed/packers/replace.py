"""What ``--overwrite`` may replace (docs/untrusted-data.md).

Only what is verifiably a pixfeed dataset: a ``pixfeed.json`` that is a valid
manifest, every file it lists present, and nothing else in the folder (or
under the bucket prefix) but those files, the folders that hold them and the
manifest.  A folder with any other file (notes, checkpoints, a stray
``pixfeed.json`` of ``{}``) is refused untouched, naming the first file at
fault; so is a dataset folder that holds the pack's source (SRC, or the index
file), since replacing it would delete what is being packed.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterable, Optional

from ..errors import DatasetError, OverwriteRefusedError
from ..manifest import MANIFEST_NAME, parse_manifest

RULE = ("--overwrite only replaces pixfeed datasets (a valid pixfeed.json, every file it lists present, nothing "
        "else) and empty folders, so nothing was touched: choose another DST or remove it yourself")


def not_a_dataset(manifest: Optional[bytes], present: Iterable[str], allowed: Iterable[str] = ()) -> Optional[str]:
    """Why a folder (or bucket prefix) holding the files ``present`` (relative paths, the manifest's text
    ``manifest``, None when it has none) is not a dataset that --overwrite may replace; None if it is.
    ``allowed``: other names it may hold (a killed bucket pack's marker)."""
    if manifest is None:
        return f"a folder that is not a pixfeed dataset (no {MANIFEST_NAME})"
    try:
        m = parse_manifest(manifest, MANIFEST_NAME)
    except DatasetError as e:
        return f"not a pixfeed dataset (its {MANIFEST_NAME} is not a valid manifest: {e})"
    present = set(present) - {MANIFEST_NAME, *allowed}
    expected = set(m["files"]) | {s["name"] for s in m.get("shards") or () if isinstance(s, dict)}
    missing = sorted(expected - present)
    if missing:
        return f"not a whole pixfeed dataset ({missing[0]}, listed in its {MANIFEST_NAME}, is missing)"
    extra = sorted(present - expected)
    if extra:
        return f"not only a pixfeed dataset (it also holds {extra[0]}, which its {MANIFEST_NAME} does not list)"
    return None


def local_files(folder: Path) -> Dict[str, bool]:
    """{relative path: whether it is a folder} of everything under ``folder``; links are not followed
    (a link is an entry, as a file is)."""
    out: Dict[str, bool] = {}
    todo = [Path(folder)]
    while todo:
        here = todo.pop()
        with os.scandir(here) as entries:
            for e in entries:
                rel = Path(e.path).relative_to(folder).as_posix()
                is_dir = e.is_dir(follow_symlinks=False)
                out[rel] = is_dir
                if is_dir:
                    todo.append(Path(e.path))
    return out


def check_local(dst: Path, sources: Iterable[Path]) -> None:
    """Raise OverwriteRefusedError unless the existing folder ``dst`` may be replaced: empty, or a whole
    pixfeed dataset (``not_a_dataset``) that holds none of ``sources`` (SRC, an index file)."""
    entries = local_files(dst)
    if not entries:
        return
    manifest = dst / MANIFEST_NAME
    text = manifest.read_bytes() if manifest.is_file() and not manifest.is_symlink() else None
    folders = {rel for rel, is_dir in entries.items() if is_dir}
    why = not_a_dataset(text, [rel for rel in entries if rel not in folders])
    if why is None:
        expected = set(parse_manifest(text, MANIFEST_NAME)["files"])
        stray = sorted(f for f in folders if not any(e.startswith(f"{f}/") for e in expected))
        why = stray and f"not only a pixfeed dataset (it also holds the folder {stray[0]})"
    if why:
        raise OverwriteRefusedError(f"destination {dst} is {why}; {RULE}")
    real = dst.resolve()
    for src in sources:  # DST itself as SRC is refused by the scan, naming it (a repack into itself)
        if src is not None and Path(src).resolve() != real and Path(src).resolve().is_relative_to(real):
            raise OverwriteRefusedError(f"destination {dst} holds the source {src}: replacing it would delete "
                                        "what is being packed, so nothing was touched; choose another DST")
