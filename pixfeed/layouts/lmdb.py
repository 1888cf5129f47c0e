"""Layout of the LMDB format (``--format lmdb``).

One LMDB environment in a single file (opened with ``subdir=False``, no lock
file)::

    data.mdb      key b"%010d" % i (10 ASCII digits, record index, sorts in order)
                  value = 40-byte record header + stored bytes (``pixfeed.record``):
                    "<4sBBHqQIIQ": magic b"PXFR", version 1, kind (0 raw, 1 jpeg,
                    2 png, 3 webp), reserved 0, label int64, xxh3_64 uint64 of the stored
                    bytes, height uint32, width uint32, length uint64
                  stored bytes: raw = H x W x 3 uint8 RGB; jpeg/png/webp = the file
                  key b"__pixfeed__" = JSON {"format", "count", "store", "classes",
                    "record_header"} for plain-lmdb users (it sorts after the records)
    keys.json, keys.offsets.npy, keys.utf8, pixfeed.json   (the key index: pixfeed/keyindex.py)

Reading one record with plain lmdb::

    env = lmdb.open("DST/data.mdb", subdir=False, readonly=True, lock=False)
    value = env.begin().get(b"%010d" % i)
    magic, ver, kind, _, label, xxh, h, w, n = struct.unpack_from("<4sBBHqQIIQ", value)
    data = value[40:40 + n]
"""
DATA = "data.mdb"
META_KEY = b"__pixfeed__"
META_FORMAT = "pixfeed-lmdb"


def record_key(i: int) -> bytes:
    """The key of record ``i``."""
    return b"%010d" % i
