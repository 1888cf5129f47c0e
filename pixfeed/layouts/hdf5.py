"""Layout of the HDF5 format (``--format hdf5``): its on-disk constants, imported by both
its writer (pixfeed.packers.hdf5) and its reader (pixfeed.datasets.hdf5), so the two cannot disagree.

The layout is documented once, in docs/formats.md#hdf5.  Reading it with plain
h5py: the code blocks there, which run in the test suite against a fresh pack.
Beside data.h5, ``extents.npy`` holds each record's chunk (file offset, size; encoded records: their
heap collection), read from HDF5's chunk index once the file is final: read-ahead's hints
(pixfeed.storage.extentfile); compressed packs and older ones have none.
"""
DATA = "data.h5"
EXTENTS = "extents.npy"  # N x 2 <i8: record i's chunk (or heap collection) in DATA
IMAGES = "images"
ENCODED = "encoded"
LABELS = "labels"
KEYS = "keys"
CHECKSUMS = "checksums"
FORMAT_ATTR = "pixfeed-hdf5"
COMPRESSIONS = ("lzf", "gzip")
FIELDS = "fields"
FIELD_CHECKSUMS = "field_checksums"
