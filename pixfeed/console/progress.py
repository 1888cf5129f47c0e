"""tqdm progress bars that never start tqdm's monitor thread.

A process-directed SIGINT (Ctrl-C) may be delivered to any thread that does
not block it.  When it lands on tqdm's monitor thread, a main thread blocked in
a read (a FIFO, a hung network mount) is never interrupted, and Ctrl-C does not
stop the pack.  With no extra thread, the signal always interrupts the read.
"""
import sys

from tqdm import tqdm


class Bar(tqdm):
    monitor_interval = 0  # no monitor thread (it only re-tunes miniters of stalled bars)


def shown(quiet: bool) -> bool:
    """Whether a command draws progress bars: not when asked to be quiet or when stderr is not a terminal."""
    return not quiet and sys.stderr.isatty()
