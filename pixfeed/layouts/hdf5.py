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
                 options (JSON object: the pack options), schema (JSON list: the fields)
      fields/NAME            one dataset per field of the manifest's "schema" (pixfeed.fields):
                             N x shape of its dtype when every value has one shape (int: int64,
                             float: float64, fixed ndarray, pixels-mode mask uint8 N x H x W and
                             image N x H x W x 3); str and json: utf-8 strings N; variable-shape
                             arrays and boxes: N variable-length 1-D arrays of the dtype, flattened
                             (attrs "shape": e.g. [null, 4]; reshape(-1, 4)); bytes and encoded
                             masks (PNG) and images: N variable-length uint8 arrays
      field_checksums/NAME   uint64 N  xxh3_64 of each record's stored bytes (UTF-8 text, the array's
                             bytes, the file's bytes)
    keys.json, keys.offsets.npy, keys.utf8, pixfeed.json   (the key index: pixfeed/keyindex.py)

Reading record ``i`` with plain h5py::

    with h5py.File("DST/data.h5", "r") as f:
        image = f["images"][i]                 # pixels mode: H x W x 3 RGB
        data = f["encoded"][i].tobytes()       # encoded mode: the JPEG/PNG bytes
        label = int(f["labels"][i])
        caption = f["fields/caption"][i].decode()    # a str field
        boxes = f["fields/boxes"][i].reshape(-1, 4)   # a boxes field
"""
DATA = "data.h5"
IMAGES = "images"
ENCODED = "encoded"
LABELS = "labels"
KEYS = "keys"
CHECKSUMS = "checksums"
FORMAT_ATTR = "pixfeed-hdf5"
COMPRESSIONS = ("lzf", "gzip")
FIELDS = "fields"
FIELD_CHECKSUMS = "field_checksums"
