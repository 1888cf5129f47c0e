"""``pixfeed verify DST [--deep]``: the command over ``verify.verify``, with a progress bar."""
from __future__ import annotations

from ..console.progress import Bar, shown
from ..manifest import read_manifest
from ..storage.options import add_argument, options_from_args
from .check import verify
from ..console.words import plural, printable


def cmd_verify(args) -> int:
    options = options_from_args(args.storage_option)
    manifest = read_manifest(args.dst, options, args.allow_links)  # parsed once, for every check
    total = manifest["count"]
    with Bar(total=total, unit="rec", disable=not shown(args.quiet), dynamic_ncols=True) as bar:
        report = verify(args.dst, deep=args.deep, progress=bar.update, storage_options=options,
                        allow_links=args.allow_links, manifest=manifest)
    for problem in report.problems:
        print(f"FAIL {printable(problem)}")
    if not args.quiet or report.problems:
        state = "OK" if report.ok else plural(len(report.problems), "problem")
        print(f"{state}: {args.dst}: {plural(report.files, 'file')} and {report.records:,} of "
              f"{plural(total, 'record')} checked"
              f"{' and decoded' if args.deep else ''}")
    return 0 if report.ok else 1


def add_command(subparsers) -> None:
    p = subparsers.add_parser("verify", help="check a packed dataset's files and records against its manifest")
    p.add_argument("dst", help="packed dataset directory (or a URL, s3://bucket/prefix)")
    add_argument(p)
    p.add_argument("--deep", action="store_true", help="also decode every record and check its shape")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar; print only problems")
    p.add_argument("--allow-links", action="store_true", help="read files a dataset reaches through symbolic "
                   "links or HDF5 external links and storage (refused by default: docs/untrusted-data.md)")
    p.set_defaults(func=cmd_verify)
