"""Packers: turn an image folder into a packed dataset (see pipeline.pack)."""
from .pipeline import pack
from .records import PackOptions, Record
from .writer import Writer

__all__ = ["PackOptions", "Record", "Writer", "pack"]
