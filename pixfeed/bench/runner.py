"""``run_bench``: pack and read every format x store mode beside the machine's ceilings.

Order of one run: the source (or a synthetic sample), run-wide ceilings for
the heading (memory copy, file copy, decode), the two baselines over the source folder,
then for each format and store: pack, storage read rate of the packed files
(warm, and cold with ``cold``), read through ``make_loader`` twice: for
evaluation (``crop="center"``, the row's ``read``) and for training
(``crop="random"``, random-resized crops and flips, the row's ``train``),
each beside the same baseline doing the same crops.  Stored pixels are packed at
``pack_size``, the size a random-resized crop of ``size`` needs (256 for 224:
``size / CROP_RATIO``), so one pack serves both uses, as a user packs for
training; its center crop is Resize(256) + CenterCrop(224).  Last, with
``max_side``, the first format once more as encoded images re-encoded at pack
time to at most ``max_side`` pixels, to show what that does to size and speed.  Each pack and
read measures its own ceiling just before and after it runs (decode in the
same number of processes, memory copy or file copy), so its ratio holds on a
busy machine.
A format or store mode that does not exist is refused before any work;
formats whose pack or read fails are listed in ``unavailable`` with the
reason, and the others still run.  Last, the targets (``targets.py``) and the
recommendation (``recommend.py``).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from ..storage import pagecache
from ..storage.bounded import read_file
from ..machine.cpus import available_cpus
from ..image.decode import CROP_RATIO, parse_size
from ..errors import OptionError
from ..loaders import make_loader
from ..manifest import STORES
from ..registry import FORMATS
from ..sources.folder import scan
from ..sources import scan_index
from . import ceilings, machine
from .packing import pack_measured, storage
from .reading import FolderDataset, plain_loader, read_directly, read_epochs
from .recommend import recommend
from .targets import judge

log = logging.getLogger(__name__)


@dataclass
class BenchConfig:
    src: Optional[Path] = None            # image folder; None = a synthetic sample of ``count`` images
    formats: Sequence[str] = tuple(FORMATS)
    stores: Sequence[str] = STORES
    size: Union[int, str] = 224
    batch_size: int = 64
    epochs: int = 2
    workers: Union[int, str] = "auto"     # make_loader's num_workers
    cold: bool = False
    count: int = 500
    pack_workers: Optional[int] = None    # None = the usable CPUs
    max_side: Optional[int] = 384         # one more encoded row packed with --max-side; None or 0: none
    disk_budget: Optional[int] = None     # bytes a pack may take, for the recommendation; None: free space
    index: Optional[str] = None           # an index file of src's images (pixfeed pack --index)
    fields: Sequence[str] = ()            # its --field NAME:TYPE overrides

    def __post_init__(self) -> None:
        for what, names, known in (("format", self.formats, FORMATS), ("store", self.stores, STORES)):
            if not names or set(names) - set(known):
                raise OptionError(f"bench {what}s {list(names)!r}: expected some of {', '.join(known)}")


DECODE_SAMPLE = 256 << 20  # source bytes held in memory to measure the decode ceilings on


class Bench:
    """One run's shared state: the source, a sample of its bytes in memory (DECODE_SAMPLE), the work folder."""

    def __init__(self, cfg: BenchConfig, work: Path) -> None:
        self.cfg, self.work, self.size = cfg, work, parse_size(cfg.size)
        self.pack_size = pack_size(self.size)
        self.src = Path(cfg.src) if cfg.src else self._sample()
        self.source = scan_index(cfg.index, self.src, fields=cfg.fields) if cfg.index else scan(self.src)
        if self.source.blobs is not None:
            raise OptionError(f"bench --index {cfg.index}: its images are bytes in the index; bench compares "
                              "against reading image files, so give an index of image paths")
        self.sample, self.blobs = self._read_sample()
        self.source_bytes = sum(os.stat(path).st_size for path in self.source_files())
        self.index_options = {"index": cfg.index, "field": cfg.fields} if cfg.index else {}
        self.shrunk: Dict[int, List[bytes]] = {}
        self.pack_procs = cfg.pack_workers or available_cpus()

    def _read_sample(self) -> tuple:
        """(indices, bytes) of the source images the decode ceilings are measured on, in memory: the first
        ones in order, up to DECODE_SAMPLE bytes in all, a file larger than what is left passed over (the
        folder baselines still read every image, a file at a time).  Every source image was held before: 4
        sparse 1 GiB files took over 3 GB."""
        indices, blobs, held = [], [], 0
        for i, path in enumerate(self.source_files()):
            if held + os.stat(path).st_size <= DECODE_SAMPLE:
                blobs.append(read_file(path, DECODE_SAMPLE - held, self.source.where(i), "image file"))
                indices.append(i)
                held += len(blobs[-1])
        if not blobs:
            raise OptionError(f"bench {self.src}: no source image is under {DECODE_SAMPLE >> 20} MiB, the most bench "
                              "holds in memory to measure decoding")
        return indices, blobs

    def _sample(self) -> Path:
        from ..sample import make_sample

        log.info("writing a synthetic sample of %d images", self.cfg.count)
        return make_sample(self.work / "sample", self.cfg.count)

    def decode_limit(self, processes: int, exact: bool = True, max_side: Optional[int] = None) -> dict:
        name = f"decode x{max(1, processes)}{'' if exact else ' fast'}{_side(max_side)}"
        return {"name": name, **ceilings.decode_rate(self.blobs_at(max_side), self.size, processes, exact,
                                                     [self.source.where(i) for i in self.sample])}

    def blobs_at(self, max_side: Optional[int]) -> List[bytes]:
        """The source's bytes as a pack with ``max_side`` stores them (re-encoded by the packer's own code)."""
        if not max_side:
            return self.blobs
        if max_side not in self.shrunk:
            from ..packers.options import QUALITY, PackOptions
            from ..packers.records import load_record

            opts = PackOptions(store="encoded", max_side=max_side, quality=QUALITY)
            self.shrunk[max_side] = [bytes(load_record(self.source, i, opts, []).data) for i in self.sample]
        return self.shrunk[max_side]

    def memcopy_limit(self, _workers: int = 0) -> dict:
        return {"name": "memcopy", **ceilings.memcopy()}

    def read(self, dataset, make, limit, files: Sequence[Path] = ()) -> dict:
        evict = partial(pagecache.evict, files) if self.cfg.cold and files else None
        return read_epochs(partial(make, dataset), self.cfg.epochs, limit, evict)

    def loader(self, dataset):
        return make_loader(dataset, self.cfg.batch_size, shuffle=True, num_workers=self.cfg.workers)

    def baselines(self) -> List[dict]:
        rows = []
        user_loader = partial(plain_loader, batch_size=self.cfg.batch_size)
        for name, make in (("folder (DataLoader, 4 workers)", user_loader), ("folder + make_loader", self.loader)):
            row = {"name": name, "format": "folder", "store": "files", "pack": None, "storage": None}
            for key, crop in USES:
                log.info("reading %s, %s crops", name, crop)
                with warnings.catch_warnings():  # torch's warning of more workers than CPUs: that is the point
                    warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
                    row[key] = self.read(FolderDataset(self.source, self.size, crop), make, self.decode_limit,
                                         self.source_files())
            rows.append(row)
        return rows

    def ceilings(self) -> dict:
        """Run-wide ceilings, for the heading and the chart (rows carry their own)."""
        log.info("measuring ceilings")
        return {"memcopy": self.memcopy_limit(), "file_copy": self.copy_limit(),
                "decode_1": self.decode_limit(1), "decode_1_fast": self.decode_limit(1, exact=False),
                "decode_pack": self.decode_limit(self.pack_procs)}

    def source_files(self) -> List[Path]:
        return [self.source.root / p for p in self.source.paths]

    def format_row(self, fmt: str, store: str, max_side: Optional[int] = None) -> dict:
        from ..datasets import open_dataset

        name = row_name(fmt, store, max_side)
        dst = self.work / name.replace("/", "-").replace(" ", "-")
        limit = partial(self.decode_limit, self.pack_procs) if store == "pixels" else self.copy_limit
        log.info("packing %s", name)
        # wds: at least two shards per process, as one packs for a DataLoader (else every
        # worker reads every shard, keeps 1 sample in N, and warns)
        shards = {"shard_size": -(-len(self.source) // (2 * self.pack_procs))} if fmt == "wds" else {}
        m, figures = pack_measured(self.src, dst, fmt, store, self.pack_size, self.pack_procs, limit,
                                   max_side=max_side, **shards, **self.index_options)
        files = [dst / f for f in m["files"]]
        row = {"name": name, "format": fmt, "store": store, "max_side": max_side, "pack": figures,
               "storage": storage(files, self.cfg.cold)}
        for key, crop in USES:
            log.info("reading %s, %s crops", name, crop)
            dataset = open_dataset(dst, size=self.size, crop=crop)
            exact = getattr(dataset, "exact", True)
            limit = self.memcopy_limit if store == "pixels" else partial(self.decode_limit, exact=exact,
                                                                         max_side=max_side)
            row[key] = self.read(dataset, self.loader, limit, files)
            if key == "read":
                row["direct"] = read_directly(dataset, self.cfg.batch_size, self.cfg.epochs)
        shutil.rmtree(dst, ignore_errors=True)
        return row

    def copy_limit(self) -> dict:
        return {"name": "file copy", **ceilings.file_copy(self.source.root, self.source.paths, self.work)}


def run_bench(cfg: BenchConfig, work_parent: Path) -> dict:
    """Run the benchmark; packs go to a temporary folder under ``work_parent``, removed at the end."""
    work = Path(tempfile.mkdtemp(prefix=".pixfeed-bench-", dir=work_parent))
    try:
        bench = Bench(cfg, work)
        result = {"config": {**asdict(cfg), "src": str(bench.src), "images": len(bench.source),
                             "pack_size": "x".join(map(str, bench.pack_size)) if bench.pack_size[0] != bench.pack_size[1]
                             else str(bench.pack_size[0]),
                             "source_bytes": bench.source_bytes, "pack_workers": bench.pack_procs},
                  "machine": machine.describe(work), "ceilings": bench.ceilings(),
                  "rows": bench.baselines(), "unavailable": {}}
        for fmt in cfg.formats:
            for store in cfg.stores:
                _try_row(bench, fmt, store, result)
        if cfg.max_side and "encoded" in cfg.stores:
            _try_row(bench, cfg.formats[0], "encoded", result, cfg.max_side)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["targets"] = judge(result)
    result["config"].update(_budget(cfg, work_parent))
    result["recommendation"] = recommend(result)
    return result


def _budget(cfg: BenchConfig, work_parent: Path) -> dict:
    if cfg.disk_budget:
        return {"disk_budget": cfg.disk_budget, "disk_budget_from": "--disk-budget"}
    return {"disk_budget": shutil.disk_usage(work_parent).free, "disk_budget_from": f"free space under {work_parent}"}


def _try_row(bench: Bench, fmt: str, store: str, result: Dict, max_side: Optional[int] = None) -> None:
    try:
        result["rows"].append(bench.format_row(fmt, store, max_side))
    except Exception as e:  # one broken format must not hide the others' figures
        name = row_name(fmt, store, max_side)
        log.warning("%s failed", name, exc_info=True)
        result["unavailable"][name] = f"{type(e).__name__}: {e}"


USES = (("read", "center"), ("train", "random"))  # a row's key for each use, and the crop it reads with


def pack_size(size) -> tuple:
    """The stored-pixel size that serves random-resized crops of ``size``: ``size / CROP_RATIO`` (256 for 224),
    whose center crop of ``size`` is the evaluation transform Resize(256) + CenterCrop(224)."""
    return tuple(round(side / CROP_RATIO) for side in size)


def row_name(fmt: str, store: str, max_side: Optional[int] = None) -> str:
    return f"{fmt}/{store}{_side(max_side)}"


def _side(max_side: Optional[int]) -> str:
    """The suffix naming a --max-side row and its ceiling."""
    return f" max-side {max_side}" if max_side else ""
