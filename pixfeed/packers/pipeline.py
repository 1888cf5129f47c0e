"""The pack pipeline shared by every format.

A pack is planned as independent *tasks*, each a disjoint slice of the
source; a task reads its images, turns them into records and hands them to
the format's writer, which writes that task's own part of the output (rows of
a pre-sized array, a part file, a shard).  Tasks run in a process pool; only
small metadata (checksums, shapes, skipped files) comes back through pipes.

Output goes to a hidden temporary sibling of DST (``.DST.pixfeed-tmp-PID``)
and is renamed into place after the manifest is written, so a failed,
interrupted or killed pack never leaves a directory that looks valid; stale
temporary directories of dead processes are removed by the next pack.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import numpy as np

from .. import __version__, registry
from ..checksum import ALGORITHM, file_hash
from ..errors import OptionError, OutputError, PixfeedError, SourceError
from ..cpus import available_cpus
from ..manifest import KEYS_NAME, LAYOUT_VERSION, MAGIC, MANIFEST_NAME, write_json_atomic, write_manifest
from ..source import scan
from ..storage import is_url, local_path
from .options import PackOptions
from .records import Record, load_record
from .upload import Upload
from .writer import TaskResult, Writer

_WRITER: Optional[Writer] = None


def _init_worker(writer: Writer) -> None:
    global _WRITER
    _WRITER = writer


def _init_pool_worker(writer: Writer) -> None:
    """Pool workers leave Ctrl-C to the main process (which terminates them) and die
    on SIGTERM, whatever handlers the parent had installed before forking."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _init_worker(writer)


def _run_task(args) -> TaskResult:
    task, indices = args
    w = _WRITER
    result = TaskResult(task)

    def records() -> Iterator[Record]:
        for i, data in w.source.fetch(indices):
            try:
                rec = load_record(w.source, i, w.opts, result.notes, data)
            except SourceError as e:
                if w.opts.on_error == "fail":
                    raise
                result.skipped.append({"path": w.source.paths[i], "reason": str(e)})
                continue
            result.kept.append(rec.index)
            result.checksums.append(rec.checksum)
            result.shapes.append(rec.shape)
            result.stored_bytes += rec.data.nbytes if isinstance(rec.data, np.ndarray) else len(rec.data)
            yield rec

    result.extra = w.write_task(task, indices, records())
    return result


def _remove_stale_tmp(dst: Path) -> None:
    for p in dst.parent.glob(f".{dst.name}.pixfeed-*-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _run_tasks(writer: Writer, tasks: List[np.ndarray], workers: int, progress: bool,
               done: Callable[[TaskResult], None] = lambda r: None) -> List[TaskResult]:
    from .._progress import Bar

    bar = Bar(total=len(writer.source), unit="img", disable=not progress, dynamic_ncols=True)
    jobs = list(enumerate(tasks))
    results = []
    try:
        if workers == 1:
            _init_worker(writer)
            outputs = map(_run_task, jobs)
            pool = None
        else:
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            pool = ctx.Pool(workers, initializer=_init_pool_worker, initargs=(writer,))
            outputs = pool.imap_unordered(_run_task, jobs)
        for r in outputs:
            results.append(r)
            writer.task_done(r)
            done(r)
            bar.update(len(tasks[r.task]))
        if pool is not None:
            pool.close()
            pool.join()
    finally:
        if workers > 1 and pool is not None:
            pool.terminate()
        bar.close()
    return sorted(results, key=lambda r: r.task)


def pack(src, dst, format: str = "mmap", *, progress: bool = False, storage_options: Optional[dict] = None,
         **options) -> dict:
    """Pack the image folder ``src`` into a ``format`` dataset at ``dst``; return its manifest.

    ``src`` and ``dst`` may be URLs (``s3://bucket/prefix``; see pixfeed.storage,
    and pixfeed.packers.upload for a bucket DST).  Options are the fields of
    PackOptions (``store``, ``size``, ``workers``, ``on_error``, ``overwrite``,
    ...); one that ``format`` does not take (as ``shard_size`` for hdf5) raises
    OptionError naming the formats that take it.  Raises SourceError or
    OptionError with the file or option at fault; on any error nothing is left
    at ``dst``.
    """
    fmt = registry.get(format)
    opts = PackOptions.create(**options).resolve(fmt)
    cls = registry.writer_class(format)
    upload = Upload(dst, storage_options, opts.overwrite) if is_url(dst) else None
    if upload is None:
        dst = _local_dst(local_path(dst), opts.overwrite)
    source = scan(src, opts.ext, storage_options)
    if upload is None:
        tmp = _local_tmp(dst, source)
    else:
        upload.prepare()
        tmp = Path(tempfile.mkdtemp(prefix="pixfeed-pack-"))
    start = time.perf_counter()
    writer: Optional[Writer] = None
    try:
        tmp.mkdir(exist_ok=upload is not None)
        writer = cls(tmp, source, opts)
        workers = opts.workers or available_cpus()
        tasks = writer.plan(workers)
        writer.begin(tasks)
        done = (lambda r: upload.send(tmp, writer.finished(r))) if upload else (lambda r: None)
        results = _run_tasks(writer, tasks, min(workers, len(tasks)), progress, done)
        kept = np.array([i for r in results for i in r.kept], dtype=np.int64)
        skipped = [s for r in results for s in r.skipped]
        if len(kept) == 0:
            raise SourceError(f"source {source.root}: every image was skipped; first reason: {skipped[0]['reason']}")
        extra = writer.finish(kept, results)
        write_json_atomic(tmp / KEYS_NAME, [source.keys[i] for i in kept])
        manifest = _manifest(fmt, source, opts, kept, results, skipped, extra, tmp)
        manifest["stats"] = {"seconds": round(time.perf_counter() - start, 3),
                             "source_bytes": int(source.sizes.sum()),
                             "stored_bytes": sum(r.stored_bytes for r in results)}
        write_manifest(tmp, manifest)
        if upload is None:
            _replace(tmp, dst)
        else:
            upload.commit(tmp, manifest)
            shutil.rmtree(tmp)
    except BaseException as e:
        if writer is not None:
            writer.abort()
        if upload is not None:
            upload.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        if upload is None and isinstance(e, OSError) and not isinstance(e, PixfeedError):
            raise _output_error(dst, e) from e
        raise
    return manifest


def _local_dst(dst: Path, overwrite: bool) -> Path:
    if dst.exists() or dst.is_symlink():
        _check_replaceable(dst, overwrite)
    return dst


def _local_tmp(dst: Path, source) -> Path:
    """The hidden temporary sibling of a local ``dst``, after checking where ``dst`` is."""
    if not dst.parent.is_dir():
        raise OptionError(f"destination {dst}: parent folder {dst.parent} does not exist")
    if source.remote is None and dst.parent.resolve().joinpath(dst.name).is_relative_to(source.root.resolve()):
        raise OptionError(f"destination {dst} is inside the source {source.root}, where the next scan would "
                          "find it (as a class folder); choose a DST outside the source")
    _remove_stale_tmp(dst)
    return dst.parent / f".{dst.name}.pixfeed-tmp-{os.getpid()}"


def _check_replaceable(dst: Path, overwrite: bool) -> None:
    """``--overwrite`` replaces a pixfeed dataset, an empty folder or a symbolic link (the
    link, not its target); never a file or a folder holding anything else."""
    if not overwrite:
        raise OptionError(f"destination {dst} exists; pass --overwrite (overwrite=True) to replace it")
    if dst.is_symlink() or (dst.is_dir() and ((dst / MANIFEST_NAME).is_file() or not any(dst.iterdir()))):
        return
    what = "a file" if not dst.is_dir() else f"a folder that is not a pixfeed dataset (no {MANIFEST_NAME})"
    raise OptionError(f"destination {dst} is {what}; --overwrite only replaces pixfeed datasets and empty "
                      "folders, so nothing was touched: choose another DST or remove it yourself")


def _output_error(dst: Path, e: OSError) -> OutputError:
    where = f" ({e.filename})" if e.filename else ""
    kept = f"; the existing {dst} is unchanged" if dst.exists() else ""
    return OutputError(f"cannot write the dataset {dst}: {e.strerror or e}{where}; nothing was written{kept}")


def _manifest(format, source, opts, kept, results, skipped, extra, tmp) -> dict:
    hashed = {s["name"]: s["xxh3_64"] for s in extra.get("shards", ())}  # wds workers hashed their shards
    files = {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file():
            rel = p.relative_to(tmp).as_posix()
            files[rel] = {"bytes": p.stat().st_size, "xxh3_64": hashed.get(rel) or file_hash(p)}
    return {
        "magic": MAGIC, "layout_version": LAYOUT_VERSION, "format": format.name,
        "count": int(len(kept)), "classes": source.classes, "store": opts.store,
        "shape": [*opts.size, 3] if opts.store == "pixels" else None,
        "checksum": ALGORITHM, "keys_file": KEYS_NAME, "files": files,
        "skipped": skipped, "notes": source.notes + [n for r in results for n in r.notes],
        "options": opts.recorded(format), "pixfeed_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def _replace(tmp: Path, dst: Path) -> None:
    """Move the finished ``tmp`` to ``dst``; an existing ``dst`` is removed only after."""
    old = None
    if dst.exists() or dst.is_symlink():
        old = dst.parent / f".{dst.name}.pixfeed-old-{os.getpid()}"
        os.rename(dst, old)
    try:
        os.rename(tmp, dst)
    except BaseException:
        if old is not None:
            os.rename(old, dst)
        raise
    if old is not None:
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
