"""Per-rank timeline traces in the Chrome trace event format, as PyTorch's Kineto writes them.

Every rank of a run writes `RUN/trace/rank-R.json`: `traceEvents` (complete spans "X",
counters "C", thread and process names "M"), `distributedInfo` (backend, rank, world_size) and a
`schemaVersion`, the top-level fields Perfetto's UI and HolisticTraceAnalysis read. Timestamps
are microseconds since the job's common origin: every rank takes `time.perf_counter()` right
after the same barrier (`align`), so lanes of different ranks line up to within that barrier's
exit skew.

    tracer = trace.get()                         # the process's tracer (a no-op one when off)
    with tracer.span("forward", "compute"): ...  # or tracer.add(name, cat, t0, t1, **args)
    tracer.counter("bytes", sent=..., recv=...)

Lanes (threads): `main` (the training loop), `comm` (the communication thread), one per
worker on a server (`worker R`). Spans are kept in memory (a few per step and bucket: tens of
bytes each) and written once, at the end or on failure.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

SCHEMA_VERSION = 1


class NullTracer:
    """Tracing off: every call is a no-op."""

    enabled = False

    @contextmanager
    def span(self, name: str, cat: str, lane: Optional[str] = None, **args: Any) -> Iterator[None]:
        yield

    def add(self, name: str, cat: str, t0: float, t1: float, lane: Optional[str] = None, **args: Any) -> None:
        pass

    def counter(self, name: str, at: Optional[float] = None, **values: float) -> None:
        pass

    def write(self) -> Optional[Path]:
        return None


class Tracer(NullTracer):
    enabled = True

    def __init__(self, out_dir: Path, rank: int, world: int, backend: str, role: str = "worker"):
        self.path = Path(out_dir) / "trace" / f"rank-{rank}.json"
        self.rank, self.world, self.backend, self.role = rank, world, backend, role
        self.origin = time.perf_counter()
        self.events: list[dict] = []
        self.lanes: dict[str, int] = {}
        self._lock = threading.Lock()

    def align(self, origin: float) -> None:
        """Count time from `origin` (perf_counter right after a barrier all ranks passed)."""
        self.origin = origin

    def _lane(self, lane: Optional[str]) -> int:
        name = lane or ("main" if threading.current_thread() is threading.main_thread() else threading.current_thread().name)
        if name not in self.lanes:
            self.lanes[name] = len(self.lanes)
        return self.lanes[name]

    def add(self, name: str, cat: str, t0: float, t1: float, lane: Optional[str] = None, **args: Any) -> None:
        """A span from perf_counter t0 to t1."""
        ev = {"ph": "X", "name": name, "cat": cat, "pid": self.rank, "tid": self._lane(lane),
              "ts": round((t0 - self.origin) * 1e6, 3), "dur": round(max(0.0, t1 - t0) * 1e6, 3)}
        if args:
            ev["args"] = args
        with self._lock:
            self.events.append(ev)

    @contextmanager
    def span(self, name: str, cat: str, lane: Optional[str] = None, **args: Any) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, cat, t0, time.perf_counter(), lane, **args)

    def counter(self, name: str, at: Optional[float] = None, **values: float) -> None:
        ts = ((at if at is not None else time.perf_counter()) - self.origin) * 1e6
        with self._lock:
            self.events.append({"ph": "C", "name": name, "pid": self.rank, "tid": 0, "ts": round(ts, 3),
                                "args": {k: float(v) for k, v in values.items()}})

    def write(self) -> Optional[Path]:
        with self._lock:
            meta = [{"ph": "M", "name": "process_name", "pid": self.rank, "tid": 0,
                     "args": {"name": f"rank {self.rank} ({self.role})"}},
                    {"ph": "M", "name": "process_sort_index", "pid": self.rank, "tid": 0, "args": {"sort_index": self.rank}}]
            meta += [{"ph": "M", "name": "thread_name", "pid": self.rank, "tid": tid, "args": {"name": lane}}
                     for lane, tid in self.lanes.items()]
            doc = {"schemaVersion": SCHEMA_VERSION, "deviceProperties": [],
                   "distributedInfo": {"backend": self.backend, "rank": self.rank, "world_size": self.world},
                   "displayTimeUnit": "ms", "traceName": f"ringps rank {self.rank}",
                   "traceEvents": meta + sorted(self.events, key=lambda e: e["ts"])}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.path)
        return self.path


_current: NullTracer = NullTracer()


def get() -> NullTracer:
    return _current


def install(tracer: NullTracer) -> NullTracer:
    global _current
    _current = tracer
    return tracer


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())
