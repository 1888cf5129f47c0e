"""``pixfeed doctor``: what this machine gives a data loader, with a recommendation per line.

Given a dataset ``PATH``, it also reads its storage, says whether epochs
will be served from the page cache or the disk (``storage.check_cache``), and
forecasts a cold shuffled epoch's read rate from a sample of its records read
as read-ahead reads them (``storage.check_epoch``).

``diagnose`` runs every check and returns a list of ``Finding``; ``render``
prints them as a table.  Paths are arguments so tests can use fake cgroup
files and a fake shared-memory directory.  The shared-memory need assumes the
loader ``make_loader`` would build for training: ``plan.default_workers``
workers, 2 batches ready per worker (torch's default prefetch), ``batch_bytes``
each; for stored pixels too, since random-resized crops are per-sample work
done in workers (only their center crops are read in process, without shared memory).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from pixfeed.image import jpeghead as _jpeghead
from pixfeed.diagnose import bucket, devices, fetch, gpudecode, storage, system
from pixfeed.console.texttable import table
from pixfeed.diagnose.finding import INFO, OK, Finding, size
from pixfeed.machine.cpus import CGROUP_ROOT, available_cpus
from pixfeed.machine.memory import page_cache_room
from pixfeed.loaders.plan import default_workers
from pixfeed.loaders.shm import SHM_DIR
from pixfeed.storage.store import is_url

DEFAULT_BATCH_BYTES = 256 * 3 * 224 * 224  # a batch of 256 ImageNet-sized uint8 images
PREFETCH = 2


def diagnose(path: Optional[Path] = None, *, batch_bytes: int = DEFAULT_BATCH_BYTES, workers: Optional[int] = None,
             cgroup_root: Optional[Path] = None, meminfo: Path = system.MEMINFO, shm_dir: str = SHM_DIR,
             read_limit: int = storage.READ_LIMIT, store: Optional[str] = None,
             storage_options: Optional[dict] = None, cache_limit=None, batch_size: int = 256,
             image_size=None) -> List[Finding]:
    """Every check; the storage check only when ``path`` (a folder or a URL) is given; ``store``: the dataset's;
    the fetch plan for a URL with ``cache_limit`` (``fetch.py``)."""
    if workers is None:
        workers = default_workers(available_cpus(cgroup_root))
    findings = [
        system.check_cpus(cgroup_root),
        system.check_memory(cgroup_root, meminfo),
        system.check_shm(system.shm_need(batch_bytes, workers, PREFETCH), shm_dir,
                         ("random-crop training's " if store == "pixels" else "")
                         + f"{workers} workers x {PREFETCH} ready batches of {size(batch_bytes)}"),
        check_decode(store),
        devices.check_torch(),
        gpudecode.check_gpu_decode(usable=gpudecode.gpu_path_check()),
        devices.check_bandwidth(batch_bytes),
        _check_storage(path, read_limit, storage_options) if path is not None else None,
        storage.check_cache(Path(path), page_cache_room(root=cgroup_root or CGROUP_ROOT, info=meminfo))
        if path is not None and not is_url(path) else None,
        storage.check_epoch(Path(path), read_limit) if path is not None and not is_url(path) else None,
        fetch.check_fetch(str(path), storage_options, cache_limit, batch_size, image_size)
        if path is not None and is_url(path) and cache_limit is not None else None,
    ]
    return [f for f in findings if f is not None]


def _check_storage(path, read_limit: int, storage_options: Optional[dict]) -> Finding:
    if is_url(path):
        return bucket.check_bucket(str(path), storage_options, read_limit)
    return storage.check_storage(Path(path), read_limit)


def check_decode(store: Optional[str] = None) -> Finding:
    """Is the fast JPEG decode (simplejpeg) installed?  Only encoded images need it."""
    lib = _jpeghead.simplejpeg
    if lib is not None:
        return Finding("fast decode", f"simplejpeg {getattr(lib, '__version__', '')} (libjpeg-turbo)".replace("  ", " "),
                       "in use for encoded JPEGs by default (exact=True gives Pillow's pixels)", OK)
    if store == "pixels":
        return Finding("fast decode", "simplejpeg not installed", "not needed: this dataset stores pixels", OK)
    return Finding("fast decode", "simplejpeg not installed", "pip install 'pixfeed[fast]': JPEG decode by "
                   "libjpeg-turbo, about 1.3x faster reads of encoded images", INFO)


def render(findings: List[Finding]) -> str:
    return "\n".join(table(("check", "status", "value", "recommendation"),
                           [[f.check, f.status, f.value, f.advice] for f in findings]))
