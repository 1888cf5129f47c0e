"""Packers: turn an image folder into a packed dataset (see pipeline.pack)."""
from .pipeline import PackOptions, Record, Writer, pack

__all__ = ["PackOptions", "Record", "Writer", "pack"]
