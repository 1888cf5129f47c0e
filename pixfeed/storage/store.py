"""Where datasets and sources live: a local folder or a URL, through fsspec.

fsspec is the one storage layer: ``s3://bucket/prefix`` (with the ``s3`` extra,
``pip install 'pixfeed[s3]'``), ``gs://``, ``http(s)://`` (reading) and anything
else it resolves.  ``file://`` URLs and plain paths stay local paths.

* Credentials and endpoint come from the usual places (``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, ``AWS_ENDPOINT_URL_S3`` or
  ``AWS_ENDPOINT_URL`` for S3-compatible stores), and ``storage_options``
  (CLI: ``--storage-option KEY=VALUE``; pixfeed.storage.options) for anything else.
* S3 requests time out (connect 5 s, read 30 s without a byte) and transient
  failures (timeouts, 5xx, throttling) are retried with backoff: botocore makes
  3 attempts per try and s3fs up to 5 tries.  A dead endpoint surfaces as an
  error instead of a hang (a refused connection after about 30 s here).
* Every storage failure becomes a StorageError (or DatasetNotFoundError for a
  missing object) naming the URL; known secrets are masked in its text.
* A Store is a URL and options (picklable); its filesystem is made once per
  process, protocol and options, outside fsspec's instance cache: a forked child
  never frees (and so never closes) the parent's connections, which left the
  parent waiting a read timeout on a pooled connection the child had closed.
"""
from __future__ import annotations

import contextlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from ..errors import DatasetNotFoundError, PixfeedError, StorageError
from .options import mask, with_defaults

_FILESYSTEMS: dict = {}  # (pid, protocol, options) -> filesystem; a forked child keeps its parent's unused



def is_url(path) -> bool:
    """True for ``scheme://...`` other than ``file://`` (those are local paths)."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def local_path(path) -> Path:
    return Path(path[len("file://"):] if isinstance(path, str) and path.startswith("file://") else path)


def join(root, name: str):
    """``root/name`` for a local Path or a URL string."""
    return f"{root.rstrip('/')}/{name}" if is_url(root) else Path(root) / name


class BucketNotFoundError(DatasetNotFoundError):
    """The URL's bucket itself does not exist."""


class Store:
    """A folder at ``url`` (a prefix in a bucket) with its fsspec filesystem."""

    def __init__(self, url: str, storage_options: Optional[dict] = None):
        self.url, self.options = url.rstrip("/"), dict(storage_options or {})

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    @property
    def fs(self):
        """This process's filesystem for the URL's protocol and these options."""
        protocol = self.url.split("://", 1)[0]
        key = (os.getpid(), protocol, json.dumps(self.options, sort_keys=True, default=str))
        if key not in _FILESYSTEMS:
            import fsspec

            with self.errors(self.url):
                _FILESYSTEMS[key] = fsspec.filesystem(protocol, skip_instance_cache=True,
                                                      **with_defaults(self.url, self.options))
        return _FILESYSTEMS[key]

    @property
    def bucket(self) -> str:
        return self.url.split("://", 1)[1].split("/", 1)[0]

    def path(self, name: str = "") -> str:
        """The filesystem path of ``name`` below the root."""
        root = self.fs._strip_protocol(self.url).rstrip("/")
        return f"{root}/{name}" if name else root

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    @contextlib.contextmanager
    def errors(self, what: str):
        """Turn storage exceptions into pixfeed errors naming ``what``, secrets masked."""
        try:
            yield
        except PixfeedError:
            raise
        except FileNotFoundError as e:
            if "bucket does not exist" in str(e).lower() or "nosuchbucket" in str(e).lower():
                raise BucketNotFoundError(f"{what}: the bucket {self.bucket!r} does not exist at this endpoint "
                                          "(check the URL, or create the bucket)") from None
            raise DatasetNotFoundError(f"{what}: no such object") from None
        except ImportError as e:
            raise StorageError(f"{what}: this URL needs an extra package ({e}); for s3:// install "
                               "'pixfeed[s3]' (s3fs)") from None
        except PermissionError as e:
            raise StorageError(f"{what}: access denied ({mask(str(e), self.options)}): the server refused these "
                               "credentials or they may not read this object; check the credentials "
                               "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, ~/.aws, --storage-option)") from None
        except Exception as e:  # noqa: BLE001 - botocore/aiohttp raise their own types
            raise StorageError(f"{what}: storage request failed ({type(e).__name__}: "
                               f"{mask(str(e), self.options)})") from None

    def list(self) -> Dict[str, int]:
        """{relative path: size} of every object below the root, from one recursive listing (a size the
        store does not give is 0).  An http(s) URL has no listing (fsspec would follow a web page's links,
        without end on a hostile server): a StorageError."""
        if self.url.split("://", 1)[0].lower() in ("http", "https"):
            raise StorageError(f"{self.url}: an http(s) URL cannot be listed (a web page's links are not a listing); "
                               "give a bucket URL (s3://, gs://, az://) or a local folder, or an --index of files "
                               "relative to the URL")
        with self.errors(self.url):
            fs, root = self.fs, self.path().rstrip("/")
            found = fs.find(root, detail=True)
        return {p[len(root) + 1:]: int(info.get("size") or 0) for p, info in found.items()
                if info.get("type") != "directory" and p.startswith(root + "/")}

    def read(self, name: str) -> bytes:
        with self.errors(self.url_of(name)):
            return self.fs.cat_file(self.path(name))

    def read_range(self, name: str, start: int, end: int) -> bytes:
        with self.errors(self.url_of(name)):
            return self.fs.cat_file(self.path(name), start=start, end=end)

    def read_range_within(self, name: str, start: int, end: int, seconds: float, what: str) -> bytes:
        """``read_range`` that gives up after ``seconds`` (on async filesystems: s3, gcs, http); a failure is a
        StorageError whose ``transient`` says whether a retry may help (not for a missing object or refused
        credentials)."""
        try:
            fs = self.fs
            if getattr(fs, "async_impl", False):
                from fsspec.asyn import sync
                return sync(fs.loop, fs._cat_file, self.path(name), start=start, end=end, timeout=max(seconds, 0.1))
            return fs.cat_file(self.path(name), start=start, end=end)
        except (FileNotFoundError, PermissionError, ImportError, PixfeedError) as e:
            try:
                with self.errors(what):
                    raise e
            except PixfeedError as pe:
                pe.transient = False
                raise pe from None
        except Exception as e:  # noqa: BLE001 - timeouts, resets, 5xx after botocore's own retries
            err = StorageError(f"{what}: storage request failed ({type(e).__name__}: {mask(str(e), self.options)})")
            err.transient = True
            raise err from None

    def read_many(self, names: list) -> list:
        """Bytes of many objects, fetched concurrently; a failed one is a StorageError in its place."""
        with self.errors(self.url):
            got = self.fs.cat([self.path(n) for n in names], on_error="return")
        out = []
        for n in names:
            v = got.get(self.path(n))
            if isinstance(v, BaseException):
                try:
                    with self.errors(self.url_of(n)):
                        raise v
                except PixfeedError as e:
                    v = e
            out.append(v)
        return out

    def open(self, name: str, block_size: int = 8 << 20):
        """A read-only file object streaming ``name`` with read-ahead (bounded memory)."""
        with self.errors(self.url_of(name)):
            return self.fs.open(self.path(name), "rb", block_size=block_size, cache_type="readahead")

    def open_ahead(self, names: List[str]) -> Iterator:
        """Open files for ``names`` in order; while one is read, the next is opened and its
        first block fetched in a thread (at most two files' buffers in memory)."""
        def first_block(name: str):
            f = self.open(name)
            with self.errors(self.url_of(name)):
                f.read(1)
                f.seek(0)
            return f

        with ThreadPoolExecutor(1) as pool:
            ahead = [pool.submit(first_block, n) for n in names[:1]]
            for k in range(len(names)):
                if k + 1 < len(names):
                    ahead.append(pool.submit(first_block, names[k + 1]))
                yield ahead.pop(0).result()

    def put(self, local: Path, name: str) -> None:
        with self.errors(self.url_of(name)):
            self.fs.put_file(str(local), self.path(name))

    def write(self, name: str, data: bytes) -> None:
        with self.errors(self.url_of(name)):
            self.fs.pipe_file(self.path(name), data)

    def remove(self, names: list) -> None:
        if names:
            with self.errors(self.url):
                self.fs.rm([self.path(n) for n in names])
