"""Layout of the LMDB format (``--format lmdb``): its on-disk constants, imported by both
its writer (pixfeed.packers.lmdb) and its reader (pixfeed.datasets.lmdb), so the two cannot disagree.

The layout is documented once, in docs/formats.md#lmdb.  Reading it with plain
lmdb: the code blocks there, which run in the test suite against a fresh pack.
"""
DATA = "data.mdb"
META_KEY = b"__pixfeed__"
META_FORMAT = "pixfeed-lmdb"


def record_key(i: int) -> bytes:
    """The key of record ``i``."""
    return b"%010d" % i
