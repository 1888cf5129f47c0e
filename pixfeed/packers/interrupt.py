"""One place where signals end a pack: SIGINT and SIGTERM, whatever Python is running when they come.

Python runs a signal's handler in the main thread at its next bytecode.  When
that bytecode belongs to a weakref callback or a ``__del__``, the exception
the handler raises (``KeyboardInterrupt``) is printed as "ignored" and the pack
would go on to publish a dataset and exit 0.  So ``signals()`` installs
handlers that first record the signal, then raise (``KeyboardInterrupt`` for
SIGINT: exit 130 from the CLI; ``SystemExit(143)`` for SIGTERM), and
``check()`` raises again if a signal was recorded: the pack calls it after
each task's result and before it writes the manifest and publishes, so a
swallowed interrupt still ends the pack with nothing left at DST.

A signal that comes while the dataset is published (the rename into place, a
bucket's manifest: ``publishing``) or after is only recorded: once published,
the pack is done, and an interrupt must not report an interrupted pack whose
dataset stands; a publishing step that fails raises it (``check``).

Pool workers are forked with the signals blocked (``deferred``), ignore
SIGINT (the driver ends them) and die with the driver (``die_with_parent``:
Linux's ``PR_SET_PDEATHSIG``), so a ``kill -9`` of the pack leaves no worker
behind printing broken-pipe tracebacks.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from typing import Iterator, Optional

_PR_SET_PDEATHSIG = 1
SIGNALS = {signal.SIGINT, signal.SIGTERM}
_received: Optional[int] = None
_publishing = _published = _holding = False


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)


def _handle(signum, frame) -> None:
    global _received
    _received = signum
    if not (_publishing or _published or _holding):  # a pack being or already published has nothing to stop
        _raise(signum)


@contextlib.contextmanager
def signals() -> Iterator[None]:
    """SIGINT and SIGTERM end the pack (recorded, then raised) while the block runs; the handlers
    before it are put back after.  Outside the main thread Python cannot install handlers: a no-op."""
    global _received, _published
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received, _published = None, False
    before = {s: signal.signal(s, _handle) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back while the block runs (delivered after it): processes forked
    inside start with them blocked, so none runs the pack's handler before setting its own."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


@contextlib.contextmanager
def publishing() -> Iterator[None]:
    """The step that publishes the dataset: a signal while it runs is recorded, not raised (any thread
    may take a process's signal, so a thread's signal mask cannot hold it back); once the step has run,
    the pack is done and a signal ends nothing.  If the step fails, ``check`` raises the signal."""
    global _publishing, _published
    _publishing = True
    try:
        yield
        _published = True
    finally:
        _publishing = False


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A step that must run whole (a folder made and recorded as pixfeed's): a signal while it runs is
    recorded, not raised, and raised (``check``) once the step is done."""
    global _holding
    _holding = True
    try:
        yield
    finally:
        _holding = False
    check()


def published() -> bool:
    """Whether the last pack published its dataset (a signal after that interrupted nothing)."""
    return _published


def check() -> None:
    """Raise for a signal received during the pack, even one whose first raise was swallowed; nothing
    once the dataset is published."""
    if _received is not None and not _published:
        _raise(_received)


def die_with_parent(parent: int) -> None:
    """In a pool worker: be killed when the pack process dies, however it dies (Linux); a parent
    already gone before this ran ends the worker at once."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
