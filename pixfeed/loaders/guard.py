"""In-process reading with a bounded wait.

Without workers, a read that never returns (storage that stopped answering)
would block the training thread itself, where nothing can time it out.
``Guarded`` reads each batch in a helper thread, one per request (no reading
ahead, so it never competes with the training loop), while the training
thread waits ``POLL`` seconds at a time and checks the helper's progress;
after ``stall_timeout`` seconds without any it raises ``LoaderStalledError``
naming the batch's records and the file the read waits on.  The stuck thread
is left behind (a daemon; nothing can interrupt a blocked read).
"""
from __future__ import annotations

import os
import queue
import threading
from typing import Any, Iterator

from pixfeed.loaders.proc import task
from pixfeed.loaders.progress import POLL, Stall, batch_records


class Guarded(Iterator[Any]):
    """Reads ``source`` in a helper thread, one item per request, so the caller's wait has a bound."""

    def __init__(self, source: Iterator[Any], loader: Any) -> None:
        self.loader, self.batch, self.done = loader, 0, False
        self.stall = Stall(loader.pixfeed_plan.stall_timeout)
        self._requests: "queue.Queue[bool]" = queue.Queue()
        self._results: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=_serve, args=(source, self._requests, self._results),
                                        name="pixfeed-reader", daemon=True)
        self._thread.start()

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        self._requests.put(True)
        self.stall.reset()
        while True:
            try:
                ok, item = self._results.get(timeout=POLL)
                break
            except queue.Empty:
                snapshot = task(os.getpid(), self._thread.native_id)
                if self.stall.stuck(self.batch, snapshot):
                    self.close()
                    raise self.stall.error("the in-process reader", batch_records(self.loader, self.batch),
                                           snapshot) from None
        if not ok:
            self.close()
            raise item
        self.batch += 1
        return item

    def close(self) -> None:
        """Let the thread end (at once when idle, after its current read otherwise)."""
        self.done = True
        self._requests.put(False)

    def __del__(self) -> None:
        if not self.done:
            self.close()


def _serve(source: Iterator[Any], requests: "queue.Queue[bool]", results: "queue.Queue[Any]") -> None:
    """The helper thread: one item per request, until a False request (it holds no reference to the
    Guarded, so an abandoned one is collected and its __del__ ends the thread)."""
    while requests.get():
        try:
            results.put((True, next(source)))
        except BaseException as error:  # StopIteration included: re-raised in the caller
            results.put((False, error))
