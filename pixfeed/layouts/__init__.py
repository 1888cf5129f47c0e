"""On-disk layouts, one module per format (named as in ``pixfeed.registry``).

Each module holds the format's on-disk constants (file names, keys, dtypes,
member names) and is imported by both its writer (``pixfeed.packers``) and its
reader (``pixfeed.datasets``), so the two cannot disagree.  Each module's
docstring documents the layout and how to read it with the plain library
(numpy, lmdb, h5py, tar).  Layout modules import no format library, so they
sit in the core, below packers and datasets.
"""
