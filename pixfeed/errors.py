"""Error types, and ``require_int`` for integer options. Every pixfeed error names the file, record or
option at fault.

Each error also derives from the matching builtin so callers can catch either
(``except FileNotFoundError`` keeps working).
"""
from __future__ import annotations

from typing import Any


class PixfeedError(Exception):
    """Base class of every error pixfeed raises on purpose."""


class SourceError(PixfeedError, ValueError):
    """The source folder or one of its images is unusable."""


class OptionError(PixfeedError, ValueError):
    """An option has a value pixfeed cannot use."""


class DatasetError(PixfeedError, ValueError):
    """A packed dataset is not one pixfeed can read (missing or unknown manifest)."""


class DatasetNotFoundError(DatasetError, FileNotFoundError):
    """A packed dataset or one of its files is missing."""


class OutputError(PixfeedError, OSError):
    """The destination cannot be written (disk full, read-only, no permission)."""


class StorageError(PixfeedError, OSError):
    """A bucket or remote store cannot be reached, refuses access or fails a request."""


class CorruptDataError(DatasetError):
    """Stored bytes do not match their checksum, or a record cannot be parsed."""


class ImageDecodeError(SourceError):
    """Bytes that should hold an image cannot be decoded safely."""


# Hostile input stays in its place (docs/untrusted-data.md): one error per boundary.
class UnsafeNameError(SourceError):
    """A field name (an index column, a shard member, a ``pack_samples`` key) breaks the name rule; such
    names become file names, so one like ``../x`` would write outside DST."""


class OutsideSourceError(SourceError):
    """A path in an index file is absolute or leaves SRC (``..``), and ``allow_outside_src`` was not given."""


class OutsideDatasetError(DatasetError):
    """A packed dataset names a file outside itself (a manifest path, an HDF5 external link or external
    storage) or holds a symbolic link, and ``allow_links`` was not given."""


class UnsafeCacheError(PixfeedError, PermissionError):
    """The node-local cache of bucket datasets is not this user's alone (another owner, writable by
    others) or holds a symbolic link where pixfeed writes or reads."""


class OverwriteRefusedError(OptionError):
    """``--overwrite`` was asked to replace something that is not verifiably a pixfeed dataset, or a folder
    holding the source."""


class DestinationChangedError(OverwriteRefusedError):
    """Something appeared at DST (or the dataset there changed) while the pack ran: it is left as it is, and
    only what the pack made is removed."""


class NotOursError(OverwriteRefusedError):
    """Leftovers pixfeed cannot prove it made (a ``.pixfeed-packing`` marker, a temporary folder's name)
    are never deleted: a name or a marker anyone could write authorises nothing."""


def require_int(name: str, value: Any, minimum: int, auto: bool = False) -> int:
    """``value`` if it is an integer >= ``minimum`` (not a bool), else an OptionError naming ``name``;
    ``auto`` says that the caller also takes "auto" (checked before calling)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        either = "'auto' or " if auto else ""
        raise OptionError(f"{name} must be {either}an integer >= {minimum}, not {value!r}")
    return value


class LoaderError(PixfeedError, RuntimeError):
    """A loader cannot deliver a batch; the message names the worker, the records and the likely cause."""


class SharedMemoryError(LoaderError):
    """The batches in flight do not fit in ``/dev/shm``; the message gives the free space, the need and the fix."""


class WorkerDiedError(LoaderError):
    """A DataLoader worker process died (killed, out of memory, crashed) before delivering its batch."""


class LoaderStalledError(LoaderError):
    """A reader made no progress for ``stall_timeout`` seconds (stuck storage, a stopped worker)."""


# Bounded work on hostile input (docs/untrusted-data.md, "Bounded work"; limits in pixfeed.storage.bounded).
# The tar and limit errors are both a SourceError (packing) and a CorruptDataError (reading a dataset).
class DamagedTarError(SourceError, CorruptDataError):
    """A tar header no reader can walk: a negative or non-numeric size, a member that does not move on."""


class OverLimitError(SourceError, CorruptDataError):
    """Input asks for more than a documented limit allows (a file, tar member or CSV cell larger, JSON
    nested deeper, an array or a label larger); the message names the input and the limit."""


class SpecialFileError(SourceError):
    """A FIFO, device or socket (or a link to one) where a file is read: never opened for reading, as a
    FIFO would block and a device never end."""


class Location:
    """Where a record is, for error messages: ``where(i)`` runs only when the message is formatted (looking
    a key up on every read cost the first read of a 10M-record dataset a second and 700 MB)."""

    __slots__ = ("where", "i")

    def __init__(self, where, i: int) -> None:
        self.where, self.i = where, i

    def __str__(self) -> str:
        return self.where(self.i)


class MixtureError(OptionError):
    """Datasets cannot be mixed as asked (``pixfeed.mix``): an empty source, a source given twice, sources whose
    samples differ in shape or fields, weights that are negative, NaN or all zero; the message names the source."""
