"""Benchmark: what tracing costs. The same runs with --trace on and off, side by side
(interleaved), 3 repeats: median step time and wall time, and the ratio on/off.

facenet on orl-faces, loopback: allreduce with 2 workers, ps-threshold with 3 workers and
--slowdown 1,1,4 (the runs of the tracing issue's bar).

    .venv/bin/python benchmarks/trace_overhead.py
"""

from __future__ import annotations

import argparse

from common import add_out_arg, console, finish, guarded, med, run_matrix, table

SETTINGS = {"allreduce-2": {"strategy": "allreduce", "workers": 2},
            "ps-threshold-3": {"strategy": "ps-threshold", "workers": 3, "slowdown": "1,1,4"}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    add_out_arg(p)
    args = p.parse_args()
    common = {"dataset": "orl-faces", "model": "facenet", "epochs": args.epochs, "target_accuracy": None}
    out, results = run_matrix("trace-overhead", SETTINGS, {"off": {"trace": False}, "on": {"trace": True}},
                              args.repeats, common, args.out)
    lines, checks = [f"tracing overhead: facenet / orl-faces / {args.epochs} epochs / {args.repeats} repeats, medians"], []
    for s, runs in results.items():
        console.print(table(f"{s}: trace on against off", runs, "off"))
        on, off = med(runs["on"], "step_s_median"), med(runs["off"], "step_s_median")
        won, woff = med(runs["on"], "wall_s"), med(runs["off"], "wall_s")
        lines.append(f"{s}: step {on:.4f}s on vs {off:.4f}s off ({on / off:.3f}x); wall {won:.1f}s vs {woff:.1f}s "
                     f"({won / woff:.3f}x)")
        checks.append((f"{s}: tracing costs under 1% of step time (on by default)", on <= 1.01 * off,
                       f"{on / off:.4f}x (spread: on {[round(r['step_s_median'], 4) for r in runs['on']]}, "
                       f"off {[round(r['step_s_median'], 4) for r in runs['off']]})"))
        per_step = events_per_step(runs["on"][0]["run_dir"])
        cost = event_cost()
        lines.append(f"{s}: {per_step:.1f} trace events per step on the busiest rank x {cost * 1e6:.2f} us each = "
                     f"{per_step * cost / off:.4%} of a {off:.3f}s step (counted, not timed against noise)")
    finish(out, lines, checks)


def events_per_step(run_dir: str) -> float:
    """The most trace events any rank recorded per training step."""
    import json
    from pathlib import Path

    steps = max(1, sum(1 for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if '"kind": "step"' in line))
    counts = [len(json.loads(f.read_text())["traceEvents"]) for f in (Path(run_dir) / "trace").glob("rank-*.json")]
    workers = max(1, len([f for f in (Path(run_dir) / "trace").glob("rank-*.json")]))
    return max(counts) * workers / steps


def event_cost(n: int = 200_000) -> float:
    """Seconds one span costs the recording thread (a timed loop of Tracer.add)."""
    import tempfile
    import time

    from ringps.trace import Tracer

    t = Tracer(tempfile.mkdtemp(), 0, 1, "gloo")
    t0 = time.perf_counter()
    for i in range(n):
        t.add("backward", "compute", 1.0, 2.0, bytes=i)
    return (time.perf_counter() - t0) / n


if __name__ == "__main__":
    guarded(main)
