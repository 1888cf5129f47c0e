"""Layout of the memory-mapped format (``--format mmap``): its on-disk constants, imported by both
its writer (pixfeed.packers.mmap) and its reader (pixfeed.datasets.mmap), so the two cannot disagree.

The layout is documented once, in docs/formats.md#mmap.  Reading it with plain
numpy: the code blocks there, which run in the test suite against a fresh pack.
"""
IMAGES = "images.npy"
DATA = "data.bin"
OFFSETS = "offsets.npy"
LABELS = "labels.npy"
CHECKSUMS = "checksums.npy"
LABEL_DTYPE = OFFSET_DTYPE = "<i8"
CHECKSUM_DTYPE = "<u8"
FIELDS = "fields"


def field_file(name: str, part: str) -> str:
    """The file of field ``name``: part "npy" (fixed shape), "bin", "offsets" or "checksums"."""
    return f"{FIELDS}/{name}.npy" if part == "npy" else f"{FIELDS}/{name}.{part}" + ("" if part == "bin" else ".npy")
