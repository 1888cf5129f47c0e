"""Converting what people already have: WebDataset shards and pixfeed datasets as pack sources.

    python benchmarks/bench_convert.py [SRC] [--count 500] [--reps 3]

Two ratios, each of two rates measured in this run (best of ``--reps``):

* packing (mmap, encoded) from WebDataset shards holding SRC's images (written
  here with plain tarfile, img2dataset's layout: ``.jpg`` + ``.txt`` per sample)
  against packing the same images from the folder (target >= 90%);
* repacking an encoded mmap dataset into LMDB (encoded: no decode, checksums
  checked on the way in) against a plain copy of the source dataset's data file
  (bytes per second; target >= 50%).

SRC: an image folder (default: a synthetic sample of ``--count`` images).
"""
from __future__ import annotations

import argparse
import io
import shutil
import tarfile
import tempfile
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", nargs="?", type=Path)
    p.add_argument("--count", type=int, default=500)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="pixfeed-convert-") as tmp:
        work = Path(tmp)
        src = args.src or make_sample(work / "sample", args.count)
        write_shards(src, work / "shards")
        folder = best(lambda: pixfeed.pack(src, work / "from-folder", "mmap", store="encoded", overwrite=True),
                      args.reps)
        shards = best(lambda: pixfeed.pack(work / "shards", work / "from-shards", "mmap", store="encoded",
                                           overwrite=True), args.reps)
        n = pixfeed.open_dataset(work / "from-folder").manifest["count"]
        data = work / "from-folder" / "data.bin"
        copy = best(lambda: shutil.copyfile(data, work / "copy.bin"), args.reps)
        repack = best(lambda: pixfeed.pack(work / "from-folder", work / "lmdb", "lmdb", store="encoded",
                                           overwrite=True), args.reps)
        size = data.stat().st_size
        print(f"{n} images, {size / 1e6:.1f} MB encoded")
        print(f"pack from shards vs from the folder: {n / shards:,.0f} vs {n / folder:,.0f} images/s, "
              f"{folder / shards:.0%} (target >= 90%)")
        print(f"repack encoded mmap -> lmdb vs a file copy: {size / repack / 1e6:,.0f} vs {size / copy / 1e6:,.0f} MB/s, "
              f"{copy / repack:.0%} (target >= 50%)")


if __name__ == "__main__":
    main()
