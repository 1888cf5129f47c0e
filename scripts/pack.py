#!/usr/bin/env python3
"""``python scripts/pack.py --format wds SRC DST ...``: the same as ``pixfeed pack``."""
import sys

from pixfeed.cli import main

if __name__ == "__main__":
    sys.exit(main(["pack", *sys.argv[1:]]))
