"""Converting what people already have: WebDataset shards and pixfeed datasets as pack sources.

    python benchmarks/bench_convert.py [SRC] [--count 500] [--copies 1] [--reps 3]

Ratios of two rates measured in this run (best of ``--reps``; dirty pages
written back, ``os.sync``, before each timed step, as a pack or a copy left
them):

* packing (mmap, encoded) from WebDataset shards holding SRC's images (written
  here with plain tarfile, img2dataset's layout: ``.jpg`` + ``.txt`` per sample)
  against packing the same images from the folder (target >= 90%);
* repacking an encoded mmap dataset into each format (encoded: no decode,
  checksums checked on the way in), and LMDB and HDF5 datasets into shards
  and shards into mmap, against a plain copy of the source dataset's data file
  (bytes per second; target >= 50%): copies and repacks alternate, and each
  repack is set against the fastest copy of the run;
* for LMDB and HDF5, their libraries' own write of the same records from
  memory (the writer's calls, with nothing read or checked): what a repack
  into them could reach at most.

SRC: an image folder (default: a synthetic sample of ``--count`` images);
``--copies N`` copies every image N times (a dataset of N x SRC, as the peer
kit makes 10,000 images of 500: fixed costs weigh less).
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import tarfile
import tempfile
import time
import timeit
from pathlib import Path

import pixfeed
from pixfeed.sample import make_sample
from pixfeed.sources import scan


def best(fn, reps: int) -> float:
    """Fastest of ``reps`` runs of ``fn``, in seconds."""
    return min(timeit.repeat(fn, number=1, repeat=reps))


def write_shards(src: Path, out: Path, per_shard: int = 100) -> None:
    source = scan(src)
    out.mkdir(parents=True)
    for s in range(0, len(source), per_shard):
        with tarfile.open(out / f"{s // per_shard:05d}.tar", "w") as tar:
            for i in range(s, min(s + per_shard, len(source))):
                data = (source.root / source.paths[i]).read_bytes()
                for ext, blob in (("jpg", data), ("txt", f"image {source.paths[i]}".encode())):
                    info = tarfile.TarInfo(f"{i:09d}.{ext}")
                    info.size = len(blob)
                    tar.addfile(info, io.BytesIO(blob))


def repeated(src: Path, out: Path, copies: int) -> Path:
    """An image folder holding every image of ``src`` ``copies`` times (copied: as many distinct files
    and bytes as the shards hold)."""
    if copies == 1:
        return src
    source = scan(src)
    for k in range(copies):
        for rel in source.paths:
            dst = out / Path(rel).parent / f"{k:03d}-{Path(rel).name}"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source.root / rel, dst)
    return out


def synced(fn):
    """``fn`` after the dirty pages are written back (untimed)."""
    def run():
        os.sync()
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", nargs="?", type=Path)
    p.add_argument("--count", type=int, default=500)
    p.add_argument("--copies", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="pixfeed-convert-") as tmp:
        work = Path(tmp)
        src = repeated(args.src or make_sample(work / "sample", args.count), work / "repeated", args.copies)
        write_shards(src, work / "shards")
        folder = best(lambda: pixfeed.pack(src, work / "from-folder", "mmap", store="encoded", overwrite=True),
                      args.reps)
        shards = best(lambda: pixfeed.pack(work / "shards", work / "from-shards", "mmap", store="encoded",
                                           overwrite=True), args.reps)
        n = pixfeed.open_dataset(work / "from-folder").manifest["count"]
        data = work / "from-folder" / "data.bin"
        size = data.stat().st_size
        print(f"{n} images, {size / 1e6:.1f} MB encoded")
        print(f"pack from shards vs from the folder: {n / shards:,.0f} vs {n / folder:,.0f} images/s, "
              f"{folder / shards:.0%} (target >= 90%)")
        copies, repacks = [], {}
        for fmt in ("mmap", "wds", "lmdb", "hdf5") * args.reps:  # copies and repacks alternate
            copies.append(synced(lambda: shutil.copyfile(data, work / "copy.bin"))())
            (work / "copy.bin").unlink()
            repacks.setdefault(fmt, []).append(synced(lambda: pixfeed.pack(work / "from-folder", work / fmt, fmt,
                                                                           store="encoded"))())
            shutil.rmtree(work / fmt)
        for fmt in ("lmdb", "hdf5", "wds") * args.reps:  # each format as the source, repacked into shards
            pixfeed.pack(work / "from-folder", work / f"src-{fmt}", fmt, store="encoded", overwrite=True)
            copies.append(synced(lambda: shutil.copyfile(data, work / "copy.bin"))())
            (work / "copy.bin").unlink()
            new = "mmap" if fmt == "wds" else "wds"
            repacks.setdefault(f"{fmt} -> {new}", []).append(
                synced(lambda: pixfeed.pack(work / f"src-{fmt}", work / "new", new, store="encoded"))())
            shutil.rmtree(work / "new")
        records = _records(work / "from-folder")
        ceilings = {"lmdb": best(synced(lambda: _lmdb_puts(records, work / "x.mdb")), args.reps),
                    "hdf5": best(synced(lambda: _h5_rows(records, work / "x.h5")), args.reps)}
        copy = min(copies)  # the fastest copy of the run: the ratios are the least flattering
        print(f"a file copy of data.bin: {size / copy / 1e6:,.0f} MB/s at best "
              f"({size / max(copies) / 1e6:,.0f} at worst) in {len(copies)} copies")
        for fmt, times in repacks.items():
            name = fmt if "->" in fmt else f"mmap -> {fmt}"
            print(f"repack encoded {name}: {size / min(times) / 1e6:,.0f} MB/s, {copy / min(times):.0%} of "
                  "the copy (target >= 50%)")
        for fmt, seconds in ceilings.items():
            print(f"  {fmt}'s own write of the same records from memory (no read, no checks): "
                  f"{size / seconds / 1e6:,.0f} MB/s, {copy / seconds:.0%} of the copy; the repack runs at "
                  f"{seconds / min(repacks[fmt]):.0%} of it")


def _records(dataset: Path) -> list:
    """Every record's bytes of an encoded mmap dataset, in memory."""
    import numpy as np

    offsets, data = np.load(dataset / "offsets.npy"), (dataset / "data.bin").read_bytes()
    return [data[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _lmdb_puts(records: list, path: Path) -> None:
    """The LMDB writer's own calls (8 MiB appending transactions, a sync at the end), on bytes in memory."""
    import lmdb

    env = lmdb.open(str(path), subdir=False, lock=False, sync=False, metasync=False,
                    map_size=2 * sum(map(len, records)) + (64 << 20))
    txn, filled = None, 0
    for i, value in enumerate(records):
        txn = txn or env.begin(write=True)
        txn.put(b"%012d" % i, value, append=True)
        filled += len(value)
        if filled >= 8 << 20:
            txn.commit()
            txn, filled = None, 0
    if txn is not None:
        txn.commit()
    env.sync(True)
    env.close()
    path.unlink()


def _h5_rows(records: list, path: Path) -> None:
    """The HDF5 writer's own calls (variable-length uint8 rows, 256 a write), on bytes in memory."""
    import h5py
    import numpy as np

    with h5py.File(path, "w") as f:
        out = f.create_dataset("encoded", (len(records),), h5py.vlen_dtype(np.uint8))
        for start in range(0, len(records), 256):
            block = np.empty(len(records[start:start + 256]), dtype=object)
            for j, data in enumerate(records[start:start + 256]):
                block[j] = np.frombuffer(data, np.uint8)
            out.write_direct(block, dest_sel=np.s_[start:start + len(block)])
    path.unlink()


if __name__ == "__main__":
    main()
