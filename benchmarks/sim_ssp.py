"""Benchmark: the simulator's SSP bound (ps-ssp) against measured runs, beside ps-async.

SSP holds a worker's reply at the server while it is more than T pushes ahead of the slowest
(ringps/ps/policies/ssp.py, woken by the server's notify_all when a push comes in). The
validation grid (benchmarks/simulator.py) has no ps-ssp cell, so this measures it where the bound
binds: 4 workers at 1 Gbit/s with 1,1,2,4, T = 0 and T = 1, with ps-async, which SSP does not
hold, as the control. Calibrated as the grid is, on 2-worker runs at the same link (allreduce,
fp16 and ps-async: compute, link and the servers' efficiency), never on the runs it predicts.
Each cell --repeats times, every cell once before any twice; per run the measured step, the
predicted one and the error.

    .venv/bin/python benchmarks/sim_ssp.py --out runs/bench-ssp
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from common import add_out_arg, console, guarded, run_matrix
from simulator import PROBES, cells, runs_in, score, split

from ringps.sim.calibrate import duplex_from_probes, read_run
from ringps.sim.workload import load_workload

COMMON = {"dataset": "orl-faces", "model": "facenet", "target_accuracy": None, "eval_every": 1000}
CALIBRATION = {"w2-1gbit": {"workers": 2, "net": "1gbit"}}
CELLS = {"w4-1gbit-slow": {"workers": 4, "net": "1gbit", "slowdown": "1,1,2,4"}}
CAL_CONTENDERS = {s: {"strategy": s} for s in ("allreduce", "fp16", "ps-async")}
CONTENDERS = {"ps-async": {"strategy": "ps-async"},
              "ps-ssp-T0": {"strategy": "ps-ssp", "staleness_threshold": 0},
              "ps-ssp-T1": {"strategy": "ps-ssp", "staleness_threshold": 1}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="steps per run")
    p.add_argument("--repeats", type=int, default=2, help="runs of each cell (seeds 0, 1, ...)")
    add_out_arg(p)
    args = p.parse_args()
    out = args.out or Path("runs") / "bench-ssp"
    common = {**COMMON, "steps": args.steps}
    for rep in range(args.repeats):  # every cell once before any twice, calibration next to validation
        run_matrix("ssp", CALIBRATION, CAL_CONTENDERS, 1, common, out, first_seed=rep)
        run_matrix("ssp", CELLS, CONTENDERS, 1, common, out, first_seed=rep)
    import simulator

    simulator.DUPLEX.update(duplex_from_probes(PROBES))
    calib, test = split([read_run(r) for r in runs_in(out)])
    _, by_setting, _, f, _ = score(calib, test, load_workload("facenet"), show=True)
    lines = [f"calibrated on {len(calib)} 2-worker runs: compute {f.compute_a:.3f} x profile per whole core "
             f"(a parameter-server worker's {f.ps_compute_a or f.compute_a:.3f}), link efficiency {f.efficiency:.3f}, "
             f"the servers' {f.server_efficiency}"]
    for setting, label in sorted(cells(test)):
        rows = [r for r in by_setting[setting] if r[0] == label]
        e = [(pred - meas) / meas for _, meas, pred in rows]
        lines.append(f"{setting} {label}: measured {', '.join(f'{meas:.3f}' for _, meas, _ in rows)} s, predicted "
                     f"{rows[0][2]:.3f} s, error {', '.join(f'{x:+.0%}' for x in e)} (median {statistics.median(e):+.1%})")
    for line in lines:
        console.print(line)
    (out / "report.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(guarded(main))
