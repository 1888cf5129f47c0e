"""The pack pipeline shared by every format.

A pack is planned as independent *tasks*, each a disjoint slice of the
source; a task reads its images, turns them into records and hands them to
the format's writer, which writes that task's own part of the output (rows of
a pre-sized array, a part file, a shard).  Tasks run on an executor
(``pixfeed.packers.executors``: a local process pool, or Ray tasks on a
cluster); only small metadata (checksums, skipped files) comes back,
and the driver joins the parts and writes the manifest last.

Output goes to a hidden temporary sibling of DST (``.DST.pixfeed-tmp-PID``)
and is put in place after the manifest is written (``replace.publish``: DST
checked again, an old dataset exchanged in one step), so a failed, interrupted
or killed pack never leaves a directory that looks valid; a dead pack's
temporary folders are removed by the next pack when its record in the user's
cache proves pixfeed made them (``replace.remove_leftovers``).
"""
from __future__ import annotations

import datetime
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

import numpy as np

from .. import __version__, keyindex, registry
from ..checksum import ALGORITHM, file_hash
from ..storage.chunked import manifest_entry
from ..errors import OptionError, OutputError, OverwriteRefusedError, PixfeedError, SourceError
from ..fields import per_box_fields
from ..manifest import KEYS_NAME, LAYOUT_VERSION, MAGIC, MANIFEST_NAME, write_json_atomic, write_manifest
from ..sources import Source, scan_source
from ..sources.samples import from_inputs, function_name, scan_samples
from ..storage.store import is_url, local_path
from . import interrupt, replace
from .executors import LocalExecutor, make_executor, run_tasks
from .fieldparts import FieldParts
from .fromdataset import is_dataset, kept_store, scan_dataset
from .options import PackOptions
from .records import condense_notes
from .upload import Upload
from .writer import Writer

def pack(src, dst, format: str = "mmap", *, progress: bool = False, storage_options: Optional[dict] = None,
         executor="local", address: Optional[str] = None, task_cpus: Optional[float] = None, **options) -> dict:
    """Pack the image folder ``src`` into a ``format`` dataset at ``dst``; return its manifest.

    ``src`` and ``dst`` may be URLs (``s3://bucket/prefix``; see pixfeed.storage.store,
    and pixfeed.packers.upload for a bucket DST).  Options are the fields of
    PackOptions (``store``, ``size``, ``workers``, ``on_error``, ``overwrite``,
    ...); one that ``format`` does not take (as ``shard_size`` for hdf5) raises
    OptionError naming the formats that take it.  Raises SourceError or
    OptionError with the file or option at fault; on any error nothing is left
    at ``dst``.  ``executor`` runs the pack tasks: "local" (a process pool of
    ``workers``) or "ray" (Ray tasks of ``task_cpus`` CPUs each on the cluster at
    ``address``; see pixfeed.packers.ray_executor); both give the same dataset.
    """
    fmt = registry.get(format)
    repack = src is not None and not isinstance(src, Source) and is_dataset(src)
    if repack:
        options = kept_store(src, options)
    opts = PackOptions.create(**options).resolve(fmt)
    cls = registry.writer_class(format)
    executor = make_executor(executor, opts.workers, address, task_cpus)
    upload = Upload(dst, storage_options, opts.overwrite) if is_url(dst) else None
    if upload is None:
        replace.remove_leftovers(local_path(dst))  # first: a replaced dataset a kill left aside is put back
        dst = _local_dst(local_path(dst), opts.overwrite, _sources(src, opts))
    if isinstance(src, Source):  # samples already gathered (pack_samples)
        source = src
    else:
        walk = executor.map if isinstance(executor, LocalExecutor) else map  # shards walked on the local workers
        if repack and opts.class_names is not None:
            raise OptionError(f"--class-names (class_names=) names integer labels of an index file, shards or "
                              f"samples; the dataset {src} has its classes already")
        source = scan_dataset(src, dst, walk, opts.allow_links) if repack else \
            scan_source(src, opts, storage_options, walk)
    if opts.per_box:
        source.per_box = per_box_fields(source.schema, opts.per_box)
    if options.get("size") is None and not repack:  # small images of one size: not upscaled to the default
        from .sizes import keep_source_size

        opts = keep_source_size(source, opts)
    tmp = _local_tmp(dst, source) if upload is None else _bucket_tmp(upload, source)
    with interrupt.signals():
        return _pack(fmt, cls, opts, executor, upload, dst, source, tmp, progress)


def pack_samples(samples, dst, format: str = "mmap", *, inputs: Optional[Sequence] = None,
                 schema: Optional[Dict[str, str]] = None, **options) -> dict:
    """Pack samples given in Python (``pixfeed.sources.samples``): an iterable of dicts
    (``{"image": path | bytes | uint8 array, "label": ..., "caption": ..., ...}``), or ``fn`` with
    ``inputs=[...]``, where ``fn(input)`` yields such dicts and runs over the inputs on the pack's
    executor (``workers`` forked processes, or Ray tasks).  ``schema`` ({field: type}) overrides
    inferred field types; the other options are ``pack``'s (format, store, on_error, executor, ...),
    with the same atomic output and checksums."""
    if not callable(samples):
        if inputs is not None:
            raise OptionError("pack_samples: inputs= goes with a function of one input; these samples are an iterable")
        return pack(scan_samples(samples, None, schema, {"kind": "python"}, options.get("class_names")), dst,
                    format, **options)
    if inputs is None:
        raise OptionError("pack_samples(fn, DST, inputs=[...]): give the inputs fn is called with")
    executor = make_executor(options.pop("executor", "local"), options.get("workers"), options.pop("address", None),
                             options.pop("task_cpus", None))
    with executor:  # fn over the inputs, then the pack, on one executor (one Ray connection)
        items, names, notes = from_inputs(samples, inputs, executor, options.get("on_error", "fail"))
        source = scan_samples(items, names, schema,
                              {"kind": "python", "function": function_name(samples), "inputs": len(inputs)},
                              options.get("class_names"))
        source.notes += notes
        return pack(source, dst, format, executor=executor, **options)


def _pack(fmt, cls, opts: PackOptions, executor, upload: Optional[Upload], dst, source, tmp: Path,
          progress: bool) -> dict:
    """The pack once its source is scanned and its temporary output placed; nothing left at DST on error."""
    start = time.perf_counter()
    writer: Optional[Writer] = None
    try:
        if upload is None:
            replace.make_temporary(tmp)  # recorded as pixfeed's own, for the next pack to clear if this one is killed
        writer = cls(tmp, source, opts)
        done = (lambda r: upload.send(tmp, writer.finished(r))) if upload else (lambda r: None)
        with executor:
            tasks = writer.plan(executor.slots)
            writer.begin(tasks)
            results = run_tasks(writer, tasks, executor, progress, done)
        kept = np.array([i for r in results for i in r.kept], dtype=np.int64)
        skipped = list(source.skipped) + [s for r in results for s in r.skipped]  # the scan's, then the tasks'
        if len(kept) == 0:
            raise SourceError(f"source {source.root}: every image was skipped; first reason: {skipped[0]['reason']}")
        extra = writer.finish(kept, results)
        FieldParts(tmp).remove()
        keys = [source.keys[i] for i in kept]
        write_json_atomic(tmp / KEYS_NAME, keys)
        extra = {**extra, **keyindex.write(tmp, keys)}
        manifest = _manifest(fmt, source, opts, kept, results, skipped, extra, tmp, writer.hashed)
        manifest["stats"] = {"seconds": round(time.perf_counter() - start, 3),
                             "source_bytes": int(source.sizes.sum()),
                             "stored_bytes": sum(r.stored_bytes for r in results)}
        interrupt.check()
        write_manifest(tmp, manifest)
        interrupt.check()
        if upload is None:
            with interrupt.publishing():
                replace.publish(tmp, dst, opts.overwrite, [source.root] if source.remote is None else [])
        else:
            upload.commit(tmp, manifest)
            shutil.rmtree(tmp)
    except BaseException as e:
        if writer is not None:
            writer.abort()
        if upload is not None:
            upload.abort()
        replace.discard(tmp) if upload is None else shutil.rmtree(tmp, ignore_errors=True)
        interrupt.check()  # interrupted: whatever the signal broke on its way out (a file closed twice)
        if upload is None and isinstance(e, OSError) and not isinstance(e, PixfeedError):
            raise _output_error(dst, e) from e
        raise
    return manifest


def _local_dst(dst: Path, overwrite: bool, sources=()) -> Path:
    if dst.exists() or dst.is_symlink():
        _check_replaceable(dst, overwrite, sources)
    return dst


def _sources(src, opts: PackOptions) -> list:
    """The local paths a pack reads (SRC, the index file), which no --overwrite may delete."""
    named = [] if isinstance(src, Source) or src is None or is_url(src) else [local_path(src)]
    return named + ([Path(opts.index)] if opts.index is not None and not is_url(opts.index) else [])


def _local_tmp(dst: Path, source) -> Path:
    """The hidden temporary sibling of a local ``dst``, after checking where ``dst`` is."""
    if not dst.parent.is_dir():
        what = "is a file, not a folder" if dst.parent.exists() else "does not exist"
        raise OptionError(f"destination {dst}: parent folder {dst.parent} {what}")
    if source.remote is None and source.walked and \
            dst.parent.resolve().joinpath(dst.name).is_relative_to(source.root.resolve()):
        raise OptionError(f"destination {dst} is inside the source {source.root}, where the next scan would "
                          "find it (as a class folder); choose a DST outside the source")
    return replace.leftover(dst, "tmp")


def _bucket_tmp(upload: Upload, source) -> Path:
    """A local temporary folder for a pack into a bucket, after checking and preparing DST."""
    if source.walked and upload.store.url.startswith(f"{source.root}/"):
        raise OptionError(f"destination {upload.store.url} is inside the source {source.root}, where the next "
                          "scan would find it; choose a DST outside the source")
    if upload.overwrite and source.remote is not None and f"{source.root}/".startswith(f"{upload.store.url}/"):
        raise OverwriteRefusedError(f"destination {upload.store.url} holds the source {source.root}: replacing "
                                    "it would delete what is being packed, so nothing was touched; choose another DST")
    upload.prepare()
    return Path(tempfile.mkdtemp(prefix="pixfeed-pack-"))


def _check_replaceable(dst: Path, overwrite: bool, sources=()) -> None:
    """``--overwrite`` replaces a whole pixfeed dataset that holds none of ``sources``, an empty folder
    or a symbolic link (``replace.check_replaceable``)."""
    if not overwrite:
        raise OptionError(f"destination {dst} exists; pass --overwrite (overwrite=True) to replace it")
    replace.check_replaceable(dst, sources)


def _output_error(dst: Path, e: OSError) -> OutputError:
    where = f" ({e.filename})" if e.filename else ""
    kept = f"; the existing {dst} is unchanged" if dst.exists() else ""
    # h5py's driver errors carry the system's errno only in their text ("... errno = 28, error message = ...")
    system = re.search(r"\berrno = (\d+)", str(e))
    why = os.strerror(int(system[1])) if system else e.strerror or e
    return OutputError(f"cannot write the dataset {dst}: {why}{where}; nothing was written{kept}")


def _manifest(format, source, opts, kept, results, skipped, extra, tmp, known: dict) -> dict:
    hashed = {s["name"]: s["xxh3_64"] for s in extra.get("shards", ())}  # wds workers hashed their shards
    chunks = manifest_entry(tmp, format.name, whole=hashed, known=known)  # for reading through a chunk cache
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
        "skipped": skipped, "notes": source.notes + condense_notes([n for r in results for n in r.notes]),
        "schema": [f.to_json() for f in source.schema], "per_box": list(source.per_box), "source": source.origin,
        "options": opts.recorded(format), "pixfeed_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **chunks,
        **extra,
    }
