"""``pixfeed doctor`` and ``pixfeed profile``: the command-line face of ``pixfeed.diagnose``."""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any, Optional, Tuple

from pixfeed.errors import OptionError
from pixfeed.storage.store import is_url
from pixfeed.storage.options import add_argument, options_from_args
from pixfeed.console.words import plural

DEFAULT_SIZE = 224  # profile's size for datasets of mixed image sizes, as most training reads them


def add_doctor(sub: Any) -> None:
    p = sub.add_parser("doctor", help="what this machine gives a data loader, with a recommendation per check")
    p.add_argument("path", nargs="?", help="a dataset or image folder (or a URL, s3://bucket/prefix): "
                                           "measure the storage under it")
    p.add_argument("--batch-size", type=int, default=256, help="batch size to size shared memory for (default 256)")
    p.add_argument("--size", help=f"image size S or HxW (default: the dataset's, else {DEFAULT_SIZE})")
    p.add_argument("--workers", type=int, help="loader workers to size shared memory for (default: make_loader's rule for the usable CPUs)")
    p.add_argument("--read-mb", type=int, default=256, help="MiB to read when measuring storage (default 256)")
    p.add_argument("--cache-limit", help="with a bucket URL: the epoch's fetch plan through a chunk cache of this "
                                          "size (e.g. 200GB; the small files are staged into the cache)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    add_argument(p)
    p.set_defaults(func=cmd_doctor)


def add_profile(sub: Any) -> None:
    p = sub.add_parser("profile", help="is the training loop waiting for data? (simulated compute step)")
    p.add_argument("dataset", help="a packed pixfeed dataset")
    p.add_argument("--batch-size", type=int, default=64, help="default 64")
    p.add_argument("--step-ms", type=float, default=0.0, help="simulated compute per batch in ms: your model's step "
                   "time gives the verdict, input- or compute-bound (default 0: no step; the loader's own rate and "
                   "the step time from which training would not wait for it)")
    p.add_argument("--steps", type=int, default=50,
                   help="batches to measure after one warm-up batch, over as many epochs as it takes (default 50)")
    p.add_argument("--size", help=f"image size S or HxW, center crop (default: the stored size; {DEFAULT_SIZE} "
                                  "for images of different sizes)")
    p.add_argument("--workers", default="auto", help="num_workers: auto, tune or a number (default auto)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_profile)


def _loader_guess(path: Optional[str], size: Optional[str], batch_size: int,
                  storage_options: Optional[dict] = None) -> Tuple[int, Optional[int], Any]:
    """(batch bytes, workers make_loader would use when that is known here, the dataset's store) for doctor:
    a dataset's own image size and store (a URL's from its manifest: nothing is copied to find out).  The
    workers are those of training: stored pixels are read in process only for center crops; random-resized
    crops (crop="random", as training reads them) are per-sample work, done in workers like decoding."""
    from pixfeed.datasets import open_dataset
    from pixfeed.image.decode import parse_size
    from pixfeed.errors import PixfeedError
    from pixfeed.manifest import read_manifest

    shape, store = None, None
    if path is not None and is_url(path):
        try:
            manifest = read_manifest(path, storage_options)
        except PixfeedError:
            manifest = None
        if manifest is not None:
            store = manifest["store"]
            if store == "pixels" and manifest.get("shape"):
                shape = (3, *(parse_size(size) if size else manifest["shape"][:2]))
    elif path is not None and (Path(path) / "pixfeed.json").is_file():
        dataset = open_dataset(path, size=size)
        shape, store = dataset.fixed_shape, dataset.store
    if shape is None:
        shape = (3, *parse_size(size or DEFAULT_SIZE))
    return math.prod(shape) * batch_size, None, store


def _at_least(args: argparse.Namespace, minimum: int, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < minimum:
            raise OptionError(f"--{name.replace('_', '-')} {value}: must be at least {minimum}")


def cmd_doctor(args: argparse.Namespace) -> int:
    from pixfeed.diagnose.doctor import diagnose, render

    _at_least(args, 1, "batch_size", "read_mb")
    _at_least(args, 0, "workers")
    if args.path is not None and not is_url(args.path) and not Path(args.path).exists():
        raise OptionError(f"{args.path}: no such dataset or folder")
    batch_bytes, workers, store = _loader_guess(args.path, args.size, args.batch_size,
                                                options_from_args(args.storage_option))
    findings = diagnose(args.path, batch_bytes=batch_bytes, workers=workers if args.workers is None else args.workers,
                        read_limit=args.read_mb * 2**20, store=store,
                        storage_options=options_from_args(args.storage_option), cache_limit=args.cache_limit,
                        batch_size=args.batch_size, image_size=args.size or DEFAULT_SIZE)
    print(json.dumps([f.to_dict() for f in findings], indent=1) if args.json else render(findings))
    return 0


def _workers(text: str) -> Any:
    if text in ("auto", "tune"):
        return text
    try:
        return int(text)
    except ValueError:
        raise OptionError(f"--workers {text!r}: expected auto, tune or a number") from None


def open_sized(path: str, size: Optional[str]) -> Tuple[Any, str]:
    """The dataset with every image at one size, and how that size was chosen, in words: a dataset of
    mixed image sizes is read at DEFAULT_SIZE, center crop, unless ``size`` says otherwise."""
    from pixfeed.datasets import open_dataset

    dataset = open_dataset(path, size=size)
    if size is not None:
        how = "--size, center crop"
    elif dataset.fixed_shape is not None:
        how = "as stored"
    else:
        dataset = open_dataset(path, size=DEFAULT_SIZE)
        how = "center crop, the default for images of different sizes; --size to change"
    return dataset, how


def cmd_profile(args: argparse.Namespace) -> int:
    from pixfeed.diagnose.stall import profile_loader
    from pixfeed.loaders import make_loader

    _at_least(args, 1, "batch_size", "steps")
    dataset, how = open_sized(args.dataset, args.size)
    size = dataset.fixed_shape[1:]
    loader = make_loader(dataset, args.batch_size, num_workers=_workers(args.workers))
    step = (lambda batch: time.sleep(args.step_ms / 1000)) if args.step_ms > 0 else None
    report = profile_loader(loader, args.steps, step)
    report.no_step = step is None
    tuning = getattr(loader, "pixfeed_tuning", None)
    if args.json:
        print(json.dumps({"dataset": args.dataset, "size": size, "size_chosen": how, "batch_size": args.batch_size,
                          "step_ms": args.step_ms, "plan": loader.pixfeed_plan.reasons,
                          "tuning": tuning and tuning.to_dict(), "report": report.to_dict()}, indent=1))
        return 0 if report.steps else 1
    m = dataset.manifest
    print(f"profile of {args.dataset} ({m['format']}/{m['store']}, {plural(len(dataset), 'image')}): images at "
          f"{size[0]}x{size[1]} ({how}), batches of {args.batch_size}, {args.step_ms:g} ms simulated step")
    print(loader.pixfeed_plan)
    if tuning is not None:
        print(tuning)
    print(report)
    return 0 if report.steps else 1
