"""Layout of the LMDB format (``--format lmdb``): its on-disk constants, imported by both
its writer (pixfeed.packers.lmdb) and its reader (pixfeed.datasets.lmdb), so the two cannot disagree.

The layout is documented once, in docs/formats.md#lmdb.  Reading it with plain
lmdb: the code blocks there, which run in the test suite against a fresh pack.
Beside data.mdb, ``extents.npy`` holds where each record's value lies in it (offset from the file's
start, length), found by one cursor pass once the file is final: read-ahead's hints
(pixfeed.storage.extentfile); older packs have none, and their values are looked up.
"""
DATA = "data.mdb"
EXTENTS = "extents.npy"  # N x 2 <i8: record i's value, start and length in DATA
META_KEY = b"__pixfeed__"
META_FORMAT = "pixfeed-lmdb"


def record_key(i: int) -> bytes:
    """The key of record ``i``."""
    return b"%010d" % i
