"""Every format end to end on your images, beside the machine's limits: the same code as ``pixfeed bench``.

    python benchmarks/bench_formats.py [SRC] [--formats mmap,lmdb,hdf5,wds] [--store encoded,pixels]
        [--size 224] [--batch-size 64] [--epochs 2] [--workers auto] [--cold] [--out DIR]
"""
from __future__ import annotations

import sys

from pixfeed.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
