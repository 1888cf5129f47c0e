"""Layout of the memory-mapped format (``--format mmap``).

All little-endian, every array readable with ``numpy.load(path, mmap_mode="r")``::

    pixels mode   images.npy     uint8  N x H x W x 3  (RGB)
    encoded mode  data.bin       the image files' bytes, concatenated
                  offsets.npy    int64  N+1; record i is data.bin[offsets[i]:offsets[i+1]]
    both          labels.npy     int64  N   (-1 for a flat source)
                  checksums.npy  uint64 N   xxh3_64 of each record's stored bytes
                  keys.json, keys.offsets.npy, keys.utf8, pixfeed.json   (key index: pixfeed/keyindex.py)
    fields        one set per field of the manifest's "schema" (pixfeed.fields), under fields/:
                  fields/NAME.npy            N x shape of the field's dtype, when every value has
                                             one shape: int (int64), float (float64), fixed-shape
                                             ndarray, and in pixels mode mask (uint8 N x H x W)
                                             and image (uint8 N x H x W x 3)
                  fields/NAME.bin            otherwise: the stored bytes concatenated (UTF-8 text,
                  fields/NAME.offsets.npy    JSON text, raw bytes, array bytes, PNG/JPEG files),
                                             int64 N+1 offsets as for data.bin
                  fields/NAME.checksums.npy  uint64 N  xxh3_64 of each record's stored bytes

Reading record ``i`` with plain numpy (and a field: ``np.load("DST/fields/boxes.offsets.npy")``,
then ``np.frombuffer(bin[o[i]:o[i + 1]], "<f4").reshape(-1, 4)``)::

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
FIELDS = "fields"


def field_file(name: str, part: str) -> str:
    """The file of field ``name``: part "npy" (fixed shape), "bin", "offsets" or "checksums"."""
    return f"{FIELDS}/{name}.npy" if part == "npy" else f"{FIELDS}/{name}.{part}" + ("" if part == "bin" else ".npy")
