"""Where datasets live and how their bytes are fetched and kept.

``store``       a local folder or a URL (fsspec): open, list, read ranges, put
``options``     ``--storage-option KEY=VALUE`` and the defaults for buckets
``cache``       the node-local copy of a bucket dataset
``chunked``, ``chunkcache``, ``chunkfile``, ``chunkio``
                reading a bucket dataset larger than the local disk in checked chunks
``bucketspeed`` what a bucket delivers (requests, bytes per second)
``pagecache``   what of a file the kernel holds in memory, and read-ahead hints
"""
