"""Packing into a bucket: the pack is written to a local temporary folder as
usual, and its files are uploaded to DST (a URL) as they are finished.

* Before packing: DST holding a dataset (``pixfeed.json``) needs
  ``--overwrite``; DST holding the ``.pixfeed-packing`` marker is what a
  killed pack left and is cleared; DST holding anything else is refused
  untouched.  A bucket has no atomic rename, so replacing a dataset deletes its
  manifest first (readers then see no dataset, never a mix of old and new
  files), then its other objects.
* The marker is written first; a data file is uploaded as soon as the writer
  reports it finished (wds shards while later shards are still packed), the
  rest after ``finish``.
* The manifest is uploaded last, only after one listing shows every file it
  lists with its size; then the marker is removed.  A failed pack removes what
  it uploaded; a killed one leaves the marker and no manifest.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterable, Optional

from ..errors import OptionError, OverwriteRefusedError, StorageError
from ..manifest import MANIFEST_NAME
from ..storage.store import Store
from . import interrupt
from .replace import RULE, not_a_dataset

MARKER = ".pixfeed-packing"
UPLOADS = 8  # files uploaded at once


class Upload:
    def __init__(self, url: str, storage_options: Optional[dict], overwrite: bool):
        self.store, self.overwrite = Store(url, storage_options), overwrite
        self.sent: Dict[str, tuple] = {}      # name -> (size, mtime_ns) uploaded
        self.pending: Dict[str, Future] = {}
        self.pool: Optional[ThreadPoolExecutor] = None

    def prepare(self) -> None:
        """Check DST, clear a killed pack's leftovers (or the replaced dataset), write the marker."""
        found = self.store.list()
        if MANIFEST_NAME in found and not self.overwrite:
            raise OptionError(f"destination {self.store.url} holds a dataset; pass --overwrite (overwrite=True) "
                              "to replace it")
        if found and MANIFEST_NAME not in found and MARKER not in found:
            raise OptionError(f"destination {self.store.url} holds {len(found)} object(s) but no pixfeed dataset; "
                              "--overwrite only replaces pixfeed datasets, so nothing was touched: choose another "
                              "DST or remove them yourself")
        if MANIFEST_NAME in found:
            why = not_a_dataset(self.store.read(MANIFEST_NAME), found, allowed=[MARKER])
            if why:
                raise OverwriteRefusedError(f"destination {self.store.url} is {why}; {RULE}")
            self.store.remove([MANIFEST_NAME])
        self.store.remove(sorted(set(found) - {MANIFEST_NAME, MARKER}))
        self.store.write(MARKER, b"a pixfeed pack is writing here; no pixfeed.json = not a dataset\n")
        self.pool = ThreadPoolExecutor(UPLOADS)

    def send(self, tmp: Path, names: Iterable[str]) -> None:
        """Start uploading finished files of the local pack ``tmp``."""
        for name in names:
            self.sent[name] = _stamp(tmp / name)
            self.pending[name] = self.pool.submit(self.store.put, tmp / name, name)

    def commit(self, tmp: Path, manifest: dict) -> None:
        """Upload what is left (and files changed since their upload), check, then the manifest."""
        self._wait()
        self.store.remove(sorted(set(self.sent) - set(manifest["files"])))  # e.g. a shard left empty by skips
        self.send(tmp, [name for name in manifest["files"] if self.sent.get(name) != _stamp(tmp / name)])
        self._wait()
        found = self.store.list()
        for name, meta in manifest["files"].items():
            if found.get(name) != meta["bytes"]:
                raise StorageError(f"{self.store.url_of(name)}: {found.get(name)} bytes in the bucket after upload, "
                                   f"expected {meta['bytes']}; no manifest was written")
        with interrupt.publishing():
            self.store.put(tmp / MANIFEST_NAME, MANIFEST_NAME)
        self.store.remove([MARKER])
        self.pool.shutdown()

    def _wait(self) -> None:
        for future in self.pending.values():
            future.result()
        self.pending.clear()

    def abort(self) -> None:
        """Remove what this pack uploaded (best effort; the marker lets the next pack clear the rest)."""
        if self.pool is None:
            return
        for future in self.pending.values():
            future.cancel()
        self.pool.shutdown(wait=True)
        try:
            self.store.remove(sorted(self.sent))
            self.store.remove([MARKER])
        except Exception:  # noqa: BLE001 - the endpoint may be what failed; the marker stays then
            pass


def _stamp(path: Path) -> tuple:
    st = path.stat()
    return st.st_size, st.st_mtime_ns
