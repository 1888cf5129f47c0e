"""Packers: turn an image folder into a packed dataset (see pipeline.pack)."""
from .pipeline import pack, pack_samples
from .options import PackOptions
from .records import Record
from .writer import Writer

__all__ = ["PackOptions", "Record", "Writer", "pack", "pack_samples"]
