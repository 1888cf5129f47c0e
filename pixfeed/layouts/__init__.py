"""On-disk layouts, one module per format (named as in ``pixfeed.registry``).

Each module holds the format's on-disk constants (file names, keys, dtypes,
member names) and is imported by both its writer (``pixfeed.packers``) and its
reader (``pixfeed.datasets``), so the two cannot disagree.  The layouts,
and how to read each with the plain library (numpy, lmdb, h5py, tar), are
documented once, in docs/formats.md; each module's docstring points to its
section.  Layout modules import no format library, so they
sit in the core, below packers and datasets.
"""
