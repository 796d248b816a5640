"""Wrappers that make any DDP communication hook safe and measurable.

`OrderedHook` runs a hook's work bucket after bucket on one thread. PyTorch's own PowerSGD hook
issues its second all-reduce from a future callback; with several buckets those callbacks
interleave differently on different ranks and gloo aborts ("Is there a distributed collective
mismatch?", see PLATFORM.md). Running each bucket to completion before the next one starts gives
every rank the same collective order, while the backward pass still overlaps: DDP hands a bucket
over and goes on with the backward at once. What the hook computes is unchanged.

Both wrappers record when the last bucket became ready, which is when this worker's compute ended.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from ringps.comm.thread import CommThread

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future]


class TimedHook:
    """Calls `hook` directly; notes the wall time each bucket was handed over."""

    def __init__(self, hook: Hook):
        self.hook = hook
        self.__name__ = getattr(hook, "__name__", type(hook).__name__)  # DDP logs the hook's name
        self.__qualname__ = self.__name__
        self.last_ready = 0.0  # perf_counter when the latest bucket arrived
        self.last_ready_wall = 0.0  # time.time() of the same moment

    def mark(self) -> None:
        self.last_ready = time.perf_counter()
        self.last_ready_wall = time.time()

    # no annotations on `bucket` or the result: DDP compares them to the real classes, and this
    # module's postponed annotations would be strings
    def __call__(self, state, bucket):
        self.mark()
        return self.hook(state, bucket)

    def close(self) -> None:
        pass


class OrderedHook(TimedHook):
    """Runs `hook` for one bucket at a time on a dedicated thread, in the order DDP hands them over."""

    def __init__(self, hook: Hook, name: str = "ringps-comm"):
        super().__init__(hook)
        self._thread = CommThread(name)

    # no annotations: see TimedHook.__call__
    def __call__(self, state, bucket):
        self.mark()
        return self._thread.submit(lambda: self.hook(state, bucket).wait())

    def close(self) -> None:
        self._thread.close()
