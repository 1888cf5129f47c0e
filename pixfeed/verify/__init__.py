"""Checking a packed dataset against its manifest: ``check`` (``verify(path)``) and the
``pixfeed verify`` command (``cli``)."""
