"""The ``pixfeed`` command: sample, pack, info, demo (and the commands listed in COMMANDS)."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from . import __version__
from .console.progress import shown
from .errors import OptionError, PixfeedError
from .layouts.hdf5 import COMPRESSIONS
from .manifest import STORES
from .registry import FORMATS
from .storage.options import add_argument, options_from_args
from .console.words import human_bytes, plural, printable, printable_json

# modules that add a subcommand with add_command(subparsers); one line per command
COMMANDS: list = [
    "pixfeed.verify.cli:add_command",
    "pixfeed.diagnose.cli:add_doctor",
    "pixfeed.diagnose.cli:add_profile",
    "pixfeed.bench.cli:add_command",
]


PACK_EXAMPLES = """examples:
  pixfeed pack images ds                                  mmap, decoded 256x256 pixels (random crops to 224)
  pixfeed pack --store pixels --size 224 images ds-eval   center crops read as a plain copy (evaluation)
  pixfeed pack --format lmdb images ds-lmdb               the original JPEG/PNG bytes in one LMDB file
  pixfeed pack --store encoded --max-side 384 images ds   re-encoded to at most 384 pixels: less disk
  pixfeed pack --format wds --shard-size 1000 images shards
  pixfeed pack --on-error skip images ds                  pack the rest; the bad files are listed
  pixfeed pack --index train.csv --class-column label images ds
more: docs/packing.md"""


def _pack_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", default="mmap", choices=list(FORMATS), help="the format (default: mmap)")
    p.add_argument("--store", choices=STORES,
                   help="pixels: decoded uint8 RGB (default for mmap); encoded: the image files' bytes (default otherwise)")
    p.add_argument("--size", help="pixels mode: output size S or HxW (default 256)")
    p.add_argument("--resize", choices=("crop", "pad", "stretch"),
                   help="pixels mode: short side to S then center crop (crop), letterbox (pad) or stretch (default crop)")
    p.add_argument("--max-side", type=int, help="encoded mode: re-encode images larger than N pixels to JPEG")
    p.add_argument("--quality", type=int, help="JPEG quality for --max-side (default 90)")
    p.add_argument("--ext", help="comma-separated extensions to pack (default jpg,jpeg,png, any case)")
    p.add_argument("--workers", type=int, help="pack processes (default: the CPUs this process may use)")
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="where pack tasks run: local processes, or Ray tasks on a cluster (pip install 'pixfeed[ray]'; "
                   "default local)")
    p.add_argument("--address", help="ray: the cluster to join (default: $RAY_ADDRESS, else a local Ray)")
    p.add_argument("--task-cpus", type=float, help="ray: CPUs each pack task takes (default 1)")
    p.add_argument("--on-error", default="fail", choices=("fail", "skip"),
                   help="fail: stop at the first bad image (default); skip: pack the rest and list what was skipped")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DST dataset or empty folder (only once the new pack succeeds)")
    p.add_argument("--max-pixels", type=int, help="decompression-bomb limit in pixels (default: Pillow's)")
    p.add_argument("--full-check", action="store_true", help="encoded mode: decode every image while packing")
    p.add_argument("--index", metavar="FILE", help="CSV, JSONL or Parquet with one row per sample (image paths "
                   "relative to SRC, or image bytes in Parquet); its other columns become typed fields")
    p.add_argument("--allow-outside-src", action="store_true", help="index: also read image and mask paths that "
                   "are absolute or leave SRC (as Hugging Face's to_parquet writes); see docs/untrusted-data.md")
    p.add_argument("--allow-links", action="store_true", help="a pixfeed dataset as SRC: read it though it holds "
                   "symbolic links or HDF5 external links or storage (refused by default)")
    p.add_argument("--image-column", help="index: the image column (default: the first named image, path, file, filename)")
    p.add_argument("--field", action="append", metavar="NAME:TYPE",
                   help="index: the type of column NAME: int, float, str, json, bytes, boxes, image, mask or an "
                        "array DTYPE[d0,...] such as float32[N,4] (repeatable; default: inferred)")
    p.add_argument("--class-column", help="index: the column whose values are the classes (labels: sorted indices)")
    p.add_argument("--class-names", metavar="FILE", help="names of integer labels (an index's integer class "
                   "column, shards' .cls): a text file of one name a line, label 0 first, or a JSON list")
    p.add_argument("--fill", action="append", metavar="NAME=VALUE", help="index: store VALUE where column NAME "
                   "is null or empty (json fields keep null, float ones NaN; repeatable)")
    p.add_argument("--image-ext", help="WebDataset shards as SRC: the image member's extension when a sample has "
                   "several (jpg, jpeg, png, webp)")
    p.add_argument("--per-box", metavar="NAMES", help="index: comma-separated fields with one row per box, dropped "
                   "with the boxes a crop leaves empty")
    # format-specific: refused by pack for a format that does not take them (pixfeed.registry)
    p.add_argument("--shard-size", type=int, help="wds: at most N samples per shard")
    p.add_argument("--shard-bytes", type=_bytes_argument, metavar="BYTES",
                   help="wds: at most this many bytes per shard, e.g. 16MiB, 1GB or 50000000")
    p.add_argument("--seed", type=int, help="wds: seed of the pre-shard shuffle (default 0)")
    p.add_argument("--no-shuffle", dest="shuffle", action="store_const", const=False, help="wds: keep source order")
    p.add_argument("--compression", choices=COMPRESSIONS, help="hdf5, pixels mode: compress pixel chunks")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    add_argument(p)


def _bytes_argument(text: str) -> int:
    """A byte count as --cache-limit takes it: 16777216, '16MiB', '1.5GB' (pixfeed.storage.chunked.parse_bytes)."""
    from .storage.chunked import parse_bytes

    try:
        return parse_bytes(text)
    except OptionError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected bytes, e.g. 16777216, 16MiB or 1GB") from None


def _pack_options(args) -> dict:
    from .packers.options import PackOptions

    return {f.name: getattr(args, f.name) for f in dataclasses.fields(PackOptions)}




def cmd_pack(args) -> int:
    from .packers import interrupt, pack

    if args.dst is None:  # pack --index FILE DST: an index holding its images' bytes needs no SRC
        if not args.index:
            raise OptionError("pixfeed pack SRC DST: give the source and the destination (only --index FILE, "
                              "when the index holds the images' bytes, takes DST alone)")
        args.src, args.dst = None, args.src
    start = time.perf_counter()
    try:
        m = pack(args.src, args.dst, args.format, progress=shown(args.quiet), executor=args.executor,
                 address=args.address, task_cpus=args.task_cpus,
                 storage_options=options_from_args(args.storage_option), **_pack_options(args))
        if not args.quiet:
            _report_pack(m, args.dst, time.perf_counter() - start)
    except KeyboardInterrupt:
        if not interrupt.published():  # after the dataset was published, Ctrl-C stops only the report
            raise
    return 0


def _report_pack(m: dict, dst, secs: float) -> None:
    for note in m["notes"]:
        print(f"note: {printable(note)}", file=sys.stderr)
    for s in m["skipped"]:
        print(f"skipped: {printable(_skip_line(s))}", file=sys.stderr)
    stats = m["stats"]
    print(f"packed {plural(m['count'], 'image')} ({human_bytes(stats['stored_bytes'])} stored from "
          f"{human_bytes(stats['source_bytes'])} of source files, {len(m['skipped'])} skipped) into {dst} "
          f"as {m['format']}/{m['store']} in {secs:.1f} s: {m['count'] / secs:.0f} images/s")


def cmd_info(args) -> int:
    from .manifest import read_manifest
    from .mixing import file as mixture_file

    mixture = mixture_file.is_mixture_file(args.path)
    m = mixture_file.read(args.path) if mixture else read_manifest(args.path, options_from_args(args.storage_option))
    if args.json:
        print(printable_json(json.dumps(m, indent=1, ensure_ascii=False)))
        return 0
    if mixture:
        return _rows(mixture_file.describe(args.path))
    total = sum(f["bytes"] for f in m["files"].values())
    classes = m["classes"]
    rows = [("format", f"{m['format']} (layout version {m['layout_version']})"),
            ("records", m["count"]),
            ("store", m["store"] + (f", {m['shape'][0]}x{m['shape'][1]} RGB" if m["shape"] else "")),
            ("classes", "none (flat source)" if classes is None else
             f"{len(classes)}: {', '.join(classes[:8])}{' ...' if len(classes) > 8 else ''}"),
            ("files", f"{len(m['files'])}, {human_bytes(total)}"),
            ("checksum", m.get("checksum") or "none recorded"),
            ("fields", ", ".join(f"{f['name']} ({_field_spec(f)})" for f in m.get("schema") or ()) or "none"),
            ("source", _origin(m.get("source"))),
            ("skipped", _skipped(m.get("skipped") or [])),
            ("created", f"{m.get('created', 'unknown')} by pixfeed {m.get('pixfeed_version', 'unknown')}")]
    if m.get("shards"):
        rows.insert(5, ("shards", len(m["shards"])))
    return _rows(rows)


def _rows(rows: list) -> int:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:  # a value's lines are its own (a list), escaped one by one: input's newlines too
        print(f"{k:<{width}}  " + "\n".join(printable(line) for line in (v if isinstance(v, list) else [v])))
    return 0


SKIPPED_SHOWN = 5


def _skip_line(skip: dict) -> str:
    """A skipped file and why, its path named once."""
    return skip["reason"] if skip["path"] in skip["reason"] else f"{skip['path']}: {skip['reason']}"


def _skipped(skipped: list):
    """'0', or the lines of the count and the first files with their reasons ('pixfeed info --json' lists
    them all)."""
    if not skipped:
        return "0"
    lines = [_skip_line(s) for s in skipped[:SKIPPED_SHOWN]]
    more = len(skipped) - SKIPPED_SHOWN
    tail = [f"and {more} more (pixfeed info --json lists them all)"] if more > 0 else []
    return [f"{len(skipped)}:", *(f"  {line}" for line in lines + tail)]


def _field_spec(item: dict) -> str:
    from .fields import from_json

    return from_json([item], "manifest")[0].spec


def _origin(source) -> str:
    """The manifest's ``source`` in words; an entry missing or of another type is shown as it is (info
    describes what a manifest says, whatever it says)."""
    if not source:
        return "an image folder"
    get = lambda key: source.get(key, "?")  # noqa: E731
    if source.get("kind") == "index":
        return f"index {get('index')} (image column {get('image_column')!r})"
    if source.get("kind") == "pixfeed":
        return f"the pixfeed dataset {get('path')} ({get('format')}/{get('store')})"
    if source.get("kind") == "shards":
        shards = get("shards")
        count = plural(shards, "shard") if isinstance(shards, int) and not isinstance(shards, bool) else f"{shards!r} shards"
        return f"WebDataset shards {get('source')} ({count})"
    if source.get("kind") == "python":
        how = f"{get('function')} over {get('inputs')} inputs" if "function" in source else "an iterable"
        return f"Python samples (pixfeed.pack_samples: {how})"
    return "an image folder"


def cmd_sample(args) -> int:
    from .errors import OptionError
    from .sample import claim_folder, make_sample, mark_folder

    if args.count < 1:
        raise OptionError(f"--count {args.count}: must be at least 1")
    root = claim_folder(_out_folder(args.dir, "DIR"), args.overwrite)
    if args.index:
        from .sample_index import COMMAND, make_index_sample

        index = make_index_sample(root, args.count, args.seed)
        mark_folder(root, "index")
        if not args.quiet:
            print(f"wrote {plural(args.count, 'image')} with masks and {index} (caption, tags, boxes, "
                  f"box_classes, mask); pack it with:\n  {COMMAND.format(dir=args.dir)}")
        return 0
    make_sample(root, args.count, args.seed)
    mark_folder(root, "folder")
    if not args.quiet:
        print(f"wrote {plural(args.count, 'image')} to {args.dir}")
    return 0


def cmd_demo(args) -> int:
    """Make a sample, pack it to mmap, read it back through a DataLoader, print a summary; the work
    folder is removed at the end unless ``--out`` names it."""
    import torch

    from .datasets import MmapImageDataset
    from .packers import pack
    from .sample import claim_folder, make_sample, mark_folder

    work = _out_folder(args.out, "--out") if args.out else Path(tempfile.mkdtemp(prefix="pixfeed-demo-"))
    src, dst = work / "sample", work / "packed-mmap"
    try:
        make_sample(claim_folder(src, overwrite=True, option="--out"), args.count)
        mark_folder(src, "folder")
        print(f"1. wrote {plural(args.count, 'synthetic image')} to {src}")
        m = pack(src, dst, "mmap", size=args.size, overwrite=True, progress=shown(args.quiet))
        print(f"2. packed them to {dst}: {plural(m['count'], 'record')}, {'x'.join(map(str, m['shape']))} uint8, "
              f"{m['stats']['seconds']:.1f} s")
        ds = MmapImageDataset(dst)
        loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=0)
        start, n, first = time.perf_counter(), 0, None
        for images, labels in loader:
            n, first = n + len(images), first or images.shape  # the first batch's shape: N x C x H x W
        secs = time.perf_counter() - start
        print(f"3. read {plural(n, 'image')} back through a DataLoader: batches of {tuple(first)} "
              f"{images.dtype}, {len(ds.classes)} classes, {n / secs:.0f} images/s")
    finally:
        if not args.out:
            shutil.rmtree(work, ignore_errors=True)
    print(f"4. kept {work} ({_du(work)})" if args.out else
          f"4. removed {work} (pass --out DIR to keep the sample and the dataset)")
    return 0


def _du(folder: Path) -> str:
    return human_bytes(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()))


def _out_folder(path: str, option: str) -> Path:
    """An output folder the command may write into: created if missing; a file or an impossible place is
    an OptionError naming it."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise OptionError(f"{option} {folder}: is a file, not a folder; name a folder to write into")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OptionError(f"{option} {folder}: cannot create the folder ({e.strerror})") from None
    return folder


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pixfeed", description="Pack image folders into fast formats and feed them to GPUs.")
    parser.add_argument("--version", action="version", version=f"pixfeed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pack", help="pack images into a dataset: an image folder, an index file (--index), "
                       "WebDataset shards or a pixfeed dataset, local or in a bucket", epilog=PACK_EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="image folder: root/<class>/<img> or flat (or a URL prefix, s3://bucket/train); "
                   "WebDataset shards (a folder of .tar, a brace pattern train-{000..009}.tar, a bucket prefix); "
                   "or a pixfeed dataset to repack; with --index, the folder (or URL prefix) its paths are relative "
                   "to, left out when the index holds the images' bytes")
    p.add_argument("dst", nargs="?", help="output dataset directory (or a URL, s3://bucket/prefix)")
    _pack_arguments(p)
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("info", help="describe a packed dataset")
    p.add_argument("path", help="packed dataset directory (or a URL, s3://bucket/prefix)")
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    add_argument(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("sample", help="write a synthetic photo-like ImageFolder sample")
    p.add_argument("dir", help="folder to write the sample into: missing or empty (created if missing)")
    p.add_argument("--overwrite", action="store_true", help="replace a sample pixfeed wrote in DIR before (only "
                   "its own files, listed in DIR/.pixfeed-sample; a folder of other files is refused)")
    p.add_argument("--count", type=int, default=200, help="number of images (default 200)")
    p.add_argument("--seed", type=int, default=0, help="random seed: the same seed writes the same images (default 0)")
    p.add_argument("--index", action="store_true", help="write images/, masks/ and index.csv with captions, "
                   "multi-labels, boxes and masks (for pixfeed pack --index) instead of an ImageFolder")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("demo", help="sample -> pack (mmap) -> DataLoader, with a summary")
    p.add_argument("--out", help="working folder, kept (default: a temporary folder, removed at the end)")
    p.add_argument("--count", type=int, default=96, help="number of sample images (default 96)")
    p.add_argument("--size", default="224", help="stored pixel size S or HxW (default 224)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_demo)

    for spec in COMMANDS:
        module, _, name = spec.partition(":")
        getattr(importlib.import_module(module), name)(sub)
    return parser


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return args.func(args)
    except PixfeedError as e:
        print(f"pixfeed: error: {printable(e)}", file=sys.stderr)
        return 2
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError) as e:
        print(f"pixfeed: error: {printable(e.filename or '')}: {printable(e.strerror or e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pixfeed: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
