"""A prediction's per-worker timeline in the trace format measured runs write (trace/sim-rank-R.json):
the simulated spans of the first workers' first steps (engine.SHOWN_WORKERS, SHOWN_STEPS), named
as a run's trace names them (forward, slowdown, backward, exposed communication and each bucket's
collective on a `comm` lane, a sparse bucket's selection before it as `bucket N: selection`, where
a run's trace has `<exchange>: prepare`; a parameter-server worker's push and its wait for the reply), so a
predicted and a measured run open side by side in Perfetto."""

from __future__ import annotations

from pathlib import Path

from ringps.sim.cluster import ClusterSpec
from ringps.trace import Tracer


def write(out_dir: Path, pred, c: ClusterSpec) -> list[Path]:
    written = []
    for i, spans in sorted(pred.timeline.items()):
        t = Tracer(Path(out_dir), i, c.workers, "simulated", "predicted worker")
        t.path = Path(out_dir) / "trace" / f"sim-rank-{i}.json"
        t.origin = 0.0
        for name, cat, t0, t1, lane in spans:
            t.add(name, cat, t0, t1, lane=lane)
        written.append(t.write())
    return written
