"""A server's shard-sized buffers, pooled so its memory does not grow with the number of workers.

- `SnapshotPool`: replies are sent from immutable, versioned copies of the shard's values. A
  reply shares the copy of the current version if one exists (a free buffer that still holds it
  is reused without copying); otherwise it copies the values into a free buffer. With every
  buffer in flight, a reply either shares the newest copy in flight (an older version, labelled
  as such: the worker's next staleness counts from it) or, where the reply must be of the
  current version (layer mode), waits for a buffer. Memory: `capacity` copies, whatever the
  number of workers.
- `BufferPool`: receive buffers. A push takes one after its header is accepted and gives it back
  once applied; with all taken, the push waits (its bytes wait in the transport: back-pressure).

MXNet's and BytePS's servers reply from the current values without a copy per worker; the copy
here keeps a reply's values and its version consistent while other pushes are applied.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

import torch

from ringps.errors import CommTimeout


class Snapshot:
    __slots__ = ("values", "version", "refs")

    def __init__(self, values: torch.Tensor):
        self.values, self.version, self.refs = values, -1, 0


class SnapshotPool:
    """Versioned copies of a shard. `acquire` must be called holding `cond` (the shard's lock,
    so the values cannot change during the copy); `release` takes it."""

    def __init__(self, numel: int, capacity: int, cond: threading.Condition, timeout: float, what: str = "a reply buffer"):
        self.numel, self.capacity, self.cond, self.timeout, self.what = numel, max(1, capacity), cond, timeout, what
        self.snaps: list[Snapshot] = []
        self.copies = 0  # how many times the values were copied (statistics)

    def acquire(self, fill: Callable[[torch.Tensor], None], version: int, share_older: bool = True) -> Snapshot:
        """A snapshot of `version`; `fill(buffer)` copies the current values into a buffer."""
        while True:
            same = [s for s in self.snaps if s.version == version]
            if same:
                snap = same[0]
                break
            free = [s for s in self.snaps if s.refs == 0]
            if free or len(self.snaps) < self.capacity:
                snap = free[0] if free else Snapshot(torch.empty(self.numel))
                if not free:
                    self.snaps.append(snap)
                fill(snap.values)
                snap.version = version
                self.copies += 1
                break
            if share_older:
                snap = max(self.snaps, key=lambda s: s.version)
                break
            if not self.cond.wait(timeout=self.timeout):
                raise CommTimeout(f"waited {self.timeout:g}s for {self.what} (all {self.capacity} in flight)")
            return self.acquire(fill, version, share_older)  # the caller re-reads the version
        snap.refs += 1
        return snap

    def release(self, snap: Snapshot) -> None:
        with self.cond:
            snap.refs -= 1
            if snap.refs == 0:
                self.cond.notify_all()

    @property
    def nbytes(self) -> int:
        return sum(s.values.numel() * s.values.element_size() for s in self.snaps)


class BufferPool:
    """Receive buffers of `numel` entries, at most `capacity` of them."""

    def __init__(self, numel: int, capacity: int, timeout: float, what: str = "a receive buffer"):
        self.numel, self.capacity, self.timeout, self.what = numel, max(1, capacity), timeout, what
        self.free: list[torch.Tensor] = []
        self.made = 0
        self.cond = threading.Condition()

    def acquire(self, who: str = "") -> torch.Tensor:
        with self.cond:
            if not self.free and self.made < self.capacity:
                self.made += 1
                return torch.empty(self.numel)
            if not self.cond.wait_for(lambda: bool(self.free), timeout=self.timeout):
                raise CommTimeout(f"{who}waited {self.timeout:g}s for {self.what} (all {self.capacity} in use)")
            return self.free.pop()

    def release(self, buf: Optional[torch.Tensor]) -> None:
        if buf is None:
            return
        with self.cond:
            self.free.append(buf)
            self.cond.notify()

    @property
    def nbytes(self) -> int:
        return self.made * self.numel * 4
