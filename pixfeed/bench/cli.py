"""``pixfeed bench``: which format and settings for your images on this machine, and what they cost.

Progress goes to stderr through logging (silenced by --quiet); the
recommendation, the tables and the paths of the written files go to stdout.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import List, Union

from ..errors import OptionError
from ..manifest import STORES
from ..registry import FORMATS
from ..storage.store import is_url
from ..storage.options import add_argument, options_from_args


def _names(value: str, allowed: tuple, what: str) -> List[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise OptionError(f"--{what} {value!r}: expected a comma-separated list of {', '.join(allowed)}")
    return names


def _workers(value: str) -> Union[int, str]:
    if value == "auto":
        return value
    if not value.isdigit():
        raise OptionError(f"--workers {value!r}: expected 'auto' or a number of DataLoader workers (0 or more)")
    return int(value)


def _size(value: str) -> int:
    """'500G', '20M', '1.5T' or a number of bytes (decimal units, as disks are sold)."""
    number, unit = value[:-1] if value[-1:].isalpha() else value, value[-1:].upper() if value[-1:].isalpha() else ""
    try:
        scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}[unit]
        return int(float(number) * scale)
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"{value!r}: expected bytes, or a number with K, M, G or T") from None


def add_command(subparsers) -> None:
    p = subparsers.add_parser("bench", help="which format and settings for your images on this machine: measures every one",
                              description=__doc__.splitlines()[0].split(": ", 1)[1])
    p.add_argument("src", nargs="?", help="image folder (default: a synthetic sample of --count images), or the URL of "
                   "a packed dataset in a bucket (s3://bucket/ds): its GET speed, fetch plan and epochs read")
    p.add_argument("--index", help="an index file (CSV, JSONL, Parquet) of SRC's images and their fields, as for "
                   "pixfeed pack --index")
    p.add_argument("--field", action="append", default=[], metavar="NAME:TYPE", help="with --index: a column's type")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated (default {','.join(FORMATS)})")
    p.add_argument("--store", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)} (default: all)")
    p.add_argument("--size", help="delivered image size S or HxW (default 224; a dataset URL of stored pixels: "
                   "its stored size); stored pixels are packed at S / 0.875 (256 for 224), the margin random-resized "
                   "crops need, and every pack is read twice: training crops (crop=random) and center crops")
    p.add_argument("--batch-size", type=int, default=64, help="make_loader batch size (default 64)")
    p.add_argument("--epochs", type=int, default=2, help="epochs read per row, at least (the best counts; default 2)")
    p.add_argument("--workers", default="auto", help="make_loader num_workers: auto or N (default auto)")
    p.add_argument("--max-side", type=int, default=384,
                   help="one more encoded row, packed with --max-side N, to show its size and speed (0: none; default 384)")
    p.add_argument("--cold", action="store_true", help="evict the files from the page cache before each epoch")
    p.add_argument("--count", type=int, default=500, help="images in the synthetic sample (default 500)")
    p.add_argument("--disk-budget", type=_size, help="disk a pack may take, for the recommendation, e.g. 500G "
                   "(default: the free space under --out)")
    p.add_argument("--targets", action="store_true",
                   help="also print pixfeed's engineering targets (always in results.json)")
    p.add_argument("--out", type=Path, default=Path("pixfeed-bench"), help="results folder (default ./pixfeed-bench)")
    p.add_argument("--cache-limit", help="with a dataset URL: read it through a chunk cache of this size (e.g. 200GB) "
                   "when it is larger; default: staged whole into the node's cache")
    p.add_argument("--order", default="random", choices=("random", "quasi_random"), help="with a dataset URL: the "
                   "sampler's order (default random)")
    add_argument(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_bench)


def config(args: argparse.Namespace):
    from .runner import BenchConfig

    for name in ("batch_size", "epochs", "count"):
        if getattr(args, name) < 1:
            raise OptionError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    if args.index and args.src is None:
        raise OptionError("--index needs SRC, the folder its image paths are relative to")
    if args.max_side < 0:
        raise OptionError(f"--max-side {args.max_side}: expected 0 (no such row) or a size in pixels")
    return BenchConfig(src=Path(args.src) if args.src else None, formats=_names(args.formats, tuple(FORMATS), "formats"),
                       stores=_names(args.store, STORES, "store"), size=args.size or "224", batch_size=args.batch_size,
                       epochs=args.epochs, workers=_workers(args.workers), cold=args.cold, count=args.count,
                       max_side=args.max_side or None, disk_budget=args.disk_budget, index=args.index,
                       fields=tuple(args.field))


def cmd_bench(args: argparse.Namespace) -> int:
    from .report import markdown, write

    if args.src is not None and is_url(args.src):
        return _bench_url(args)
    for name in ("cache_limit", "storage_option"):
        if getattr(args, name):
            raise OptionError(f"--{name.replace('_', '-')} applies to a dataset URL (s3://...), not to {args.src or 'a sample'}")
    cfg = config(args)
    if not args.quiet:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("pixfeed bench: %(message)s"))
        logging.getLogger("pixfeed").addHandler(handler)
        logging.getLogger("pixfeed").setLevel(logging.INFO)
    args.out.mkdir(parents=True, exist_ok=True)
    from .runner import run_bench

    result = run_bench(cfg, args.out)
    files = write(result, args.out, args.targets)
    print(markdown(result, args.targets))
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _bench_url(args: argparse.Namespace) -> int:
    from .bucket import bench_url, render

    if args.epochs < 1 or args.batch_size < 1:
        raise OptionError("--epochs and --batch-size must be at least 1")
    result = bench_url(args.src, args.out, storage_options=options_from_args(args.storage_option),
                       cache_limit=args.cache_limit, size=args.size, batch_size=args.batch_size, epochs=args.epochs,
                       workers=_workers(args.workers), order=args.order)
    print(render(result))
    print(f"wrote {args.out / 'results.json'}")
    return 0
