"""A prediction's per-worker timeline in the trace format measured runs write (trace/sim-rank-R.json):
a few steps of the first workers, forward, backward and the exposed rest, so a predicted and a
measured run open side by side in Perfetto."""

from __future__ import annotations

from pathlib import Path

from ringps.sim.cluster import ClusterSpec
from ringps.trace import Tracer

SHOWN_WORKERS, SHOWN_STEPS = 16, 5


def write(out_dir: Path, pred, w, c: ClusterSpec) -> list[Path]:
    fwd = w.compute_s - w.backward_s
    written = []
    for i, slow in enumerate(c.slowdowns()[:SHOWN_WORKERS]):
        t = Tracer(Path(out_dir), i, c.workers, "simulated", "predicted worker")
        t.path = Path(out_dir) / "trace" / f"sim-rank-{i}.json"
        t.origin = 0.0
        start = 0.0
        for _ in range(SHOWN_STEPS):
            t.add("forward", "compute", start, start + fwd * slow, lane="main")
            t.add("backward", "compute", start + fwd * slow, start + w.compute_s * slow, lane="main")
            t.add("exposed communication", "comm", start + w.compute_s * slow, start + pred.step_s, lane="main")
            start += pred.step_s
        written.append(t.write())
    return written
