"""Layout of the HDF5 format (``--format hdf5``).

One self-contained file::

    data.h5
      images     pixels mode: uint8 N x H x W x 3 (RGB), chunked one image per
                 chunk, optionally compressed (--compression lzf|gzip)
      encoded    encoded mode: N variable-length uint8 arrays
                 (h5py.vlen_dtype(np.uint8)), each one JPEG or PNG file's bytes
      labels     int64 N   (-1 for a flat source)
      keys       utf-8 strings N (source path without extension)
      checksums  uint64 N  xxh3_64 of each record's stored bytes (uncompressed pixels)
      attrs      format "pixfeed-hdf5", store, classes (JSON list or null),
                 options (JSON object: the pack options)
    keys.json, pixfeed.json

Reading record ``i`` with plain h5py::

    with h5py.File("DST/data.h5", "r") as f:
        image = f["images"][i]                 # pixels mode: H x W x 3 RGB
        data = f["encoded"][i].tobytes()       # encoded mode: the JPEG/PNG bytes
        label = int(f["labels"][i])
"""
DATA = "data.h5"
IMAGES = "images"
ENCODED = "encoded"
LABELS = "labels"
KEYS = "keys"
CHECKSUMS = "checksums"
FORMAT_ATTR = "pixfeed-hdf5"
COMPRESSIONS = ("lzf", "gzip")
