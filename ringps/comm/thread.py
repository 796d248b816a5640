"""One communication thread per process: work runs in submission order, one item at a time.

Collectives and ring steps issued from here keep the same order on every rank (the order DDP
hands buckets over), which gloo requires; the backward pass goes on meanwhile.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

import torch


class CommThread:
    def __init__(self, name: str = "ringps-comm"):
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((fn, fut))
        return fut

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, fut = item
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
                fut.set_exception(e)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
