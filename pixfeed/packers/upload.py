"""Packing into a bucket: the pack is written to a local temporary folder as
usual, and its files are uploaded to DST (a URL) as they are finished.

* Before packing: DST holding a dataset (``pixfeed.json``) needs
  ``--overwrite``; DST holding anything else is refused untouched.  A
  ``.pixfeed-packing`` marker (a pack is writing here, or was killed) is no
  proof of anything, as anyone who may write one object under DST can write
  it: the marker names its pack's id, and only a pack whose record of that id
  is in this user's cache (``CACHE/packs/``, written by the pack as it
  uploads) counts as a killed pack's leftovers, and then only the objects that
  record names are removed, when nothing else is under DST; otherwise nothing
  is touched (``pixfeed.errors.NotOursError``).  A bucket has no atomic rename,
  so replacing a dataset records its objects, writes the marker, then deletes
  its manifest first (readers then see no dataset, never a mix of old and new
  files), then its other objects.
* A data file is uploaded as soon as the writer reports it finished (wds
  shards while later shards are still packed), the rest after ``finish``;
  each name is recorded before its upload starts.
* The manifest is uploaded last, only after one listing shows every file it
  lists with its size and nothing this pack did not write (an object that
  appeared under DST meanwhile ends the pack: ``DestinationChangedError``);
  then the marker is removed.  A failed pack removes what it uploaded; a
  killed one leaves the marker and no manifest.
"""
from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterable, Optional

from ..errors import DestinationChangedError, NotOursError, OptionError, OverwriteRefusedError, StorageError
from ..manifest import MANIFEST_NAME
from ..storage.bounded import MANIFEST_BYTES, read_object
from ..storage.store import Store
from . import interrupt
from .replace import RULE, alive, drop_journal, not_a_dataset, read_journal, write_journal

MARKER = ".pixfeed-packing"
MARKER_BYTES = 4096  # a marker is read only up to this (it names a pack id)
UPLOADS = 8  # files uploaded at once


class Upload:
    def __init__(self, url: str, storage_options: Optional[dict], overwrite: bool):
        self.store, self.overwrite = Store(url, storage_options), overwrite
        self.sent: Dict[str, tuple] = {}      # name -> (size, mtime_ns) uploaded
        self.pending: Dict[str, Future] = {}
        self.pool: Optional[ThreadPoolExecutor] = None
        self.id, self.replaced = "", []        # this pack's id (its marker's); the objects it replaces, its manifest

    def prepare(self) -> None:
        """Check DST, clear a killed pack's proven leftovers (or the replaced dataset), write the marker."""
        found = self.store.list()
        if MARKER in found:
            found = self._clear_killed(found)
        if MANIFEST_NAME in found and not self.overwrite:
            raise OptionError(f"destination {self.store.url} holds a dataset; pass --overwrite (overwrite=True) "
                              "to replace it")
        if found and MANIFEST_NAME not in found:
            raise OptionError(f"destination {self.store.url} holds {len(found)} object(s) but no pixfeed dataset; "
                              "--overwrite only replaces pixfeed datasets, so nothing was touched: choose another "
                              "DST or remove them yourself")
        if MANIFEST_NAME in found:
            manifest = read_object(self.store, MANIFEST_NAME, MANIFEST_BYTES, self.store.url_of(MANIFEST_NAME),
                                   "manifest")  # no more than one byte past the limit fetched
            why = not_a_dataset(manifest, found)
            if why:
                raise OverwriteRefusedError(f"destination {self.store.url} is {why}; {RULE}")
        self.id = uuid.uuid4().hex
        self.replaced = sorted(found)
        self._record()  # before the marker names this pack: the marker never names a pack with no record
        self.store.write(MARKER, json.dumps({"pixfeed_pack": self.id}).encode() + b"\n")
        if MANIFEST_NAME in found:
            self.store.remove([MANIFEST_NAME])
        self.store.remove(sorted(set(found) - {MANIFEST_NAME}))
        self.pool = ThreadPoolExecutor(UPLOADS)

    def _record(self, running: bool = True) -> None:
        """This pack's entry in the user's cache: what it may remove if it is killed (the dataset it replaces,
        what it uploads), and the process while it runs."""
        write_journal(f"bucket-{self.id}", {"url": self.store.url, "pid": os.getpid() if running else None,
                                            "objects": sorted({*self.replaced, *self.sent})})

    def _clear_killed(self, found: Dict[str, int]) -> Dict[str, int]:
        """``found`` without a killed pack's leftovers, removed when this user's cache records that pack and
        every object under DST is one it wrote (or was replacing); NotOursError, touching nothing, otherwise.
        A pack killed after its manifest was written leaves a whole dataset: only its marker goes."""
        url = self.store.url
        entry, pack = None, None
        if 0 < found[MARKER] <= MARKER_BYTES:
            try:
                pack = json.loads(self.store.read_range(MARKER, 0, MARKER_BYTES)).get("pixfeed_pack")
            except (ValueError, AttributeError, RecursionError):
                pack = None
            if isinstance(pack, str) and len(pack) == 32 and all(c in "0123456789abcdef" for c in pack):
                entry = read_journal(f"bucket-{pack}")
        if not entry or entry.get("url") != url or not isinstance(entry.get("objects"), list):
            raise NotOursError(
                f"destination {url} holds {MARKER}, the mark of a pack this machine has no record of (killed on "
                f"another machine, or written by someone else), and {len(found) - 1} other object(s); pixfeed "
                "deletes only what it can prove it wrote, so nothing was touched: remove them yourself or "
                "choose another DST")
        if isinstance(entry.get("pid"), int) and alive(entry["pid"]):
            raise NotOursError(f"destination {url}: another pack (process {entry['pid']}) is writing there; "
                               "nothing was touched: wait for it, or choose another DST")
        others = sorted(set(found) - set(entry["objects"]) - {MARKER})
        if others:
            raise NotOursError(self._foreign(others, "lie beside what a killed pack left, which did not write them")
                               + "; pixfeed deletes only what it can prove it wrote, so nothing was touched: "
                               "remove them yourself or choose another DST")
        if MANIFEST_NAME not in found:
            self.store.remove(sorted(set(found) - {MARKER}))
            found = {}
        self.store.remove([MARKER])
        drop_journal(f"bucket-{pack}")
        return {name: size for name, size in found.items() if name != MARKER}

    def _foreign(self, names: list, what: str) -> str:
        return f"{self.store.url_of(names[0])} (and {len(names) - 1} other object(s)) {what}"

    def send(self, tmp: Path, names: Iterable[str]) -> None:
        """Start uploading finished files of the local pack ``tmp``."""
        names = list(names)
        new = set(names) - set(self.sent)
        self.sent.update({name: _stamp(tmp / name) for name in names})
        if new:
            self._record()  # recorded before the upload starts: a kill midway leaves nothing unrecorded
        for name in names:
            self.pending[name] = self.pool.submit(self.store.put, tmp / name, name)

    def commit(self, tmp: Path, manifest: dict) -> None:
        """Upload what is left (and files changed since their upload), check, then the manifest."""
        self._wait()
        self.store.remove(sorted(set(self.sent) - set(manifest["files"])))  # e.g. a shard left empty by skips
        self.send(tmp, [name for name in manifest["files"] if self.sent.get(name) != _stamp(tmp / name)])
        self._wait()
        found = self.store.list()
        appeared = sorted(set(found) - set(manifest["files"]) - {MARKER})
        if appeared:
            raise DestinationChangedError(self._foreign(appeared, "appeared under the destination while the pack "
                                                        "ran") + "; they are left as they are, no manifest was "
                                          "written and what this pack uploaded is removed: choose another DST")
        for name, meta in manifest["files"].items():
            if found.get(name) != meta["bytes"]:
                raise StorageError(f"{self.store.url_of(name)}: {found.get(name)} bytes in the bucket after upload, "
                                   f"expected {meta['bytes']}; no manifest was written")
        self.replaced = sorted({*self.replaced, MANIFEST_NAME})
        self._record()  # the manifest too is this pack's: a kill before the marker goes leaves it provably ours
        with interrupt.publishing():
            self.store.put(tmp / MANIFEST_NAME, MANIFEST_NAME)
        self.store.remove([MARKER])
        drop_journal(f"bucket-{self.id}")
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
            drop_journal(f"bucket-{self.id}")
        except Exception:  # noqa: BLE001 - the endpoint may be what failed; the marker stays then,
            self._record(running=False)  # and the record lets the next pack clear what this one wrote


def _stamp(path: Path) -> tuple:
    st = path.stat()
    return st.st_size, st.st_mtime_ns
