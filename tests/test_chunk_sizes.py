"""A chunk cache whose chunk_bytes the manifest lists no hashes for (issue 38, item 11): no pass over the data
before the first batch (records are checked by their own checksums), and a damaged chunk never comes back as
pixels; chunks of a multiple of the listed size are checked part by part."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import xxhash

from test_chunks import CHUNK, epoch, packs, reference, remote  # noqa: F401  (the fixture)
from pixfeed.errors import CorruptDataError
from pixfeed.loaders import make_loader
from pixfeed.storage import chunkio


def test_first_batch_with_small_chunks_reads_a_few_chunks_not_the_file(packs, s3_server, tmp_path):
    local, url = packs["pixels"]
    ds = remote(url, s3_server.options, tmp_path)
    assert ds.chunks.part == 0 and ds.chunks.hashes == []  # 8 KiB chunks, 16 MiB listed: no list computed
    assert ds.chunks.stats["bytes"] == 0 and not (ds.chunks.folder.parent / f"chunks-{CHUNK}.json").exists()
    first = next(iter(make_loader(ds, batch_size=4, num_workers=0, io_ahead=0, order="random")))
    assert len(first[0]) == 4
    # today's pass fetched all 46 chunks (the whole file) before this batch: now the header's and 4 records'
    assert ds.chunks.stats["gets"] <= 1 + 4 * 2 < ds.chunks.count // 2
    assert ds.chunks.stats["bytes"] < ds.chunks.size // 4


def test_a_flipped_byte_in_a_cached_chunk_is_never_pixels(packs, s3_server, tmp_path):
    local, url = packs["pixels"]
    ds = remote(url, s3_server.options, tmp_path)
    assert epoch(make_loader(ds, batch_size=8, num_workers=0, io_ahead=0)) == reference(local)
    k, row = 3, int(np.prod(ds.stored_shape))
    i = (k * CHUNK + 100 - ds.handle["base"]) // row  # the record holding byte 100 of chunk 3
    ds[i]  # chunk 3 in the cache now
    path = ds.chunks.path(k)
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.chmod(0o600)
    path.write_bytes(bytes(data))
    gets = ds.chunks.stats["gets"]
    assert (ds[i][0].numpy().tobytes(), ds[i][1]) in reference(local)  # fetched once more, right
    assert ds.chunks.stats["gets"] > gets and ds.chunks.stats["refetches"] >= 1
    assert path.read_bytes() != bytes(data)


def test_a_chunk_damaged_in_the_bucket_is_a_named_error_with_small_chunks(packs, s3_server, tmp_path, monkeypatch):
    local, url = packs["pixels"]
    ds = remote(url, s3_server.options, tmp_path)
    ds[0]
    real = chunkio.get

    def flipped(cache, k):
        data = bytearray(real(cache, k))
        data[-1] ^= 1
        return bytes(data)
    monkeypatch.setattr(chunkio, "get", flipped)
    i = len(ds) - 1
    with pytest.raises(CorruptDataError, match="fail their xxh3_64"):
        ds[i]
    assert not ds.chunks.path(ds.chunks.count - 1).exists()  # the damaged bytes were not kept


def test_chunks_of_a_multiple_of_the_listed_size_are_checked_part_by_part():
    data = bytes(range(256)) * 100  # 25,600 bytes: parts of 4096, chunks of 8192, the last ones partial
    hashes = [xxhash.xxh3_64_hexdigest(data[i:i + 4096]) for i in range(0, len(data), 4096)]
    cache = SimpleNamespace(chunk=8192, part=4096, hashes=hashes)
    assert chunkio.matches(cache, 1, data[8192:16384]) and chunkio.matches(cache, 3, data[24576:])
    damaged = bytearray(data[8192:16384])
    damaged[5000] ^= 1
    assert not chunkio.matches(cache, 1, bytes(damaged))
