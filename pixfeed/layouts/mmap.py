"""Layout of the memory-mapped format (``--format mmap``).

All little-endian, every array readable with ``numpy.load(path, mmap_mode="r")``::

    pixels mode   images.npy     uint8  N x H x W x 3  (RGB)
    encoded mode  data.bin       the image files' bytes, concatenated
                  offsets.npy    int64  N+1; record i is data.bin[offsets[i]:offsets[i+1]]
    both          labels.npy     int64  N   (-1 for a flat source)
                  checksums.npy  uint64 N   xxh3_64 of each record's stored bytes
                  keys.json, pixfeed.json

Reading record ``i`` with plain numpy::

    images = np.load("DST/images.npy", mmap_mode="r")          # pixels mode
    image = images[i]                                          # H x W x 3 RGB
    offsets = np.load("DST/offsets.npy")                       # encoded mode
    data = np.memmap("DST/data.bin", np.uint8, "r")[offsets[i]:offsets[i + 1]]  # JPEG/PNG bytes
"""
IMAGES = "images.npy"
DATA = "data.bin"
OFFSETS = "offsets.npy"
LABELS = "labels.npy"
CHECKSUMS = "checksums.npy"
LABEL_DTYPE = OFFSET_DTYPE = "<i8"
CHECKSUM_DTYPE = "<u8"
