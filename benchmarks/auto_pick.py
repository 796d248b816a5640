"""Benchmark: `ringps train --strategy auto` against every contender it chooses among, to the target.

Per cell of the emulated cluster (facenet on ORL, target 90%, runs stopped at the target), the
contenders allreduce, fp16, PowerSGD, ring-topk and ps-async, and `--strategy auto` as a
contender of its own: it times the job's step here (~15 s before the job starts, outside its
time-to-accuracy as every run's set-up is), prices the candidates with the simulator and its
shipped progress model (no run of this grid feeds it), picks one and trains with it; the report
also sets the time it predicted for its pick against its runs'. Per cell: auto's pick and its measured time against the best measured
contender (the issue's bar: within 10% in at least 80% of cells), and Kendall's tau of the
contenders' order by predicted (the ranking in auto-plan.json) against measured time-to-accuracy
(bar 0.8 per cell). Each cell runs --repeats times, every cell once before any twice; medians.
`--calibration FILE` adds `auto-calibrated`: --strategy auto with --auto-calibration FILE (a
calibration of this machine from other runs, `ringps simulate --calibrate RUN... --out FILE`),
judged the same way.

    .venv/bin/python benchmarks/auto_pick.py --out runs/bench-auto
    .venv/bin/python benchmarks/auto_pick.py --cells w4-1gbit,w4-unshaped-slow --repeats 1
    .venv/bin/python benchmarks/auto_pick.py --cells w3-unshaped,w4-unshaped --repeats 6
    .venv/bin/python benchmarks/auto_pick.py --cells w3-unshaped --repeats 4 --first-seed 200
    .venv/bin/python benchmarks/auto_pick.py --cells w4-100mbit,w4-100mbit-slow --contenders allreduce,fp16,powersgd,ring-topk
    .venv/bin/python benchmarks/auto_pick.py --calibration CAL.yaml --out runs/bench-auto
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from common import add_out_arg, console, finish, guarded, med, run_matrix, table
from simulator import kendall

CELLS = {
    "w2-1gbit": {"workers": 2, "net": "1gbit"},
    "w3-1gbit": {"workers": 3, "net": "1gbit"},
    "w4-1gbit": {"workers": 4, "net": "1gbit"},
    "w4-1gbit-slow": {"workers": 4, "net": "1gbit", "slowdown": "1,1,2,4"},
    "w3-unshaped": {"workers": 3},  # the grid's other loopback setting (benchmarks/simulator.py)
    "w4-unshaped": {"workers": 4},
    "w4-unshaped-slow": {"workers": 4, "slowdown": "1,1,2,4"},
    # not run by default: the dense contenders take 3-7 minutes a run behind these links, and ps-async
    # ~15 (auto predicts 900 s to the target); run them with --contenders allreduce,fp16,powersgd,ring-topk
    "w4-100mbit": {"workers": 4, "net": "100mbit"},
    "w4-100mbit-slow": {"workers": 4, "net": "100mbit", "slowdown": "1,1,2,4"},
}
DEFAULT_CELLS = [c for c in CELLS if "100mbit" not in c]
CONTENDERS = ["allreduce", "fp16", "powersgd", "ring-topk", "ps-async"]
# the label of a contender's default setting in auto's ranking (ringps/sim/auto.py, Choice.label)
RANKED_AS = {"powersgd": "powersgd (powersgd_rank=4)", "ring-topk": "ring-topk (density=0.01)"}


def predicted_tau(reached: dict[str, float], ranking: dict[str, float]) -> tuple[float, int]:
    """Kendall's tau of the contenders that reached the target, by measured time against the
    ranking's predicted one (a contender under its label there, RANKED_AS), and how many."""
    pairs = [(reached[c], ranking.get(RANKED_AS.get(c, c))) for c in reached]
    pairs = [(m, p) for m, p in pairs if p is not None]
    return kendall([m for m, _ in pairs], [p for _, p in pairs]), len(pairs)


def plans(runs: list[dict]) -> list[dict]:
    return [json.loads((Path(r["run_dir"]) / "auto-plan.json").read_text()) for r in runs]


def judge(cell: str, runs: dict[str, list[dict]], auto: str) -> tuple[list[str], list[tuple[str, bool, str]]]:
    """`auto`'s pick (a contender running --strategy auto) against the best measured contender, and
    the order it predicted against the measured one."""
    lines, checks = [], []
    auto_plans = plans(runs[auto])
    picks = sorted({p["chosen"] for p in auto_plans})
    measured = {c: med(rs, "time_to_accuracy_s") for c, rs in runs.items() if not c.startswith("auto")}
    reached = {c: t for c, t in measured.items() if t is not None}
    auto_t = med(runs[auto], "time_to_accuracy_s")
    if reached:
        best = min(reached, key=reached.get)
        checks.append((f"{cell}: {auto} (picked {' / '.join(picks)}) within 10% of the best measured, {best}",
                       auto_t is not None and auto_t <= 1.1 * reached[best],
                       (f"{auto_t:.1f}s" if auto_t is not None else "never (median)")
                       + f" vs {reached[best]:.1f}s" + (f" = {auto_t / reached[best]:.2f}x" if auto_t else "")))
        # the choice apart from its own run's noise: the picked strategy's runs as a contender
        for pick in {p.split(" (")[0] for p in picks} & set(reached):
            lines.append(f"{cell}: {auto}'s pick {pick}, measured as a contender: {reached[pick]:.1f}s, "
                         f"{reached[pick] / reached[best]:.2f}x the best ({best})")
    ranking = {e["strategy"]: e["time_to_accuracy_s"] for e in auto_plans[0]["ranking"]}
    predicted = [e["time_to_accuracy_s"] for p in auto_plans for e in p["ranking"] if e["strategy"] == p["chosen"]]
    if auto_t is not None and all(predicted):  # how far the pick's own run lies from what was predicted for it
        lines.append(f"{cell}: {auto} predicted its pick at {' / '.join(f'{t:.1f}' for t in predicted)}s to the "
                     f"target; its runs took {auto_t:.1f}s (median): {auto_t / statistics.median(predicted):.2f}x")
    tau, n = predicted_tau(reached, ranking)
    checks.append((f"{cell}: Kendall tau, contenders by time-to-accuracy, {auto}'s prediction against measured, >= 0.8",
                   tau >= 0.8, f"{tau:.2f} over {n} contenders"))
    order = sorted(reached, key=reached.get)
    lines.append(f"{cell}: measured order " + " < ".join(f"{c} {reached[c]:.1f}s" for c in order)
                 + f"; {auto} predicted " + " < ".join(f"{c} {p:.1f}s" for c, p in sorted(
                     ((c, ranking.get(RANKED_AS.get(c, c))) for c in measured), key=lambda x: x[1] or 1e9) if p))
    return lines, checks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", default=",".join(DEFAULT_CELLS), help=f"any of {', '.join(CELLS)}")
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + repeats - 1 (a sitting "
                   "apart from the progress model's seeds 100-105 and the earlier sittings' 0-5)")
    p.add_argument("--epochs", type=int, default=30, help="the most a run may take; each stops at the target")
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--calibration", type=Path, help="also run --strategy auto with this --auto-calibration file")
    p.add_argument("--report-only", action="store_true", help="judge the finished runs in --out, run nothing")
    add_out_arg(p)
    args = p.parse_args()
    unknown = [c for c in args.cells.split(",") if c not in CELLS]
    if unknown:
        raise SystemExit(f"unknown cell(s) {', '.join(unknown)}; choose among {', '.join(CELLS)}")
    cells = {c: CELLS[c] for c in args.cells.split(",")}
    contenders = {c: {"strategy": c} for c in args.contenders.split(",")} | {"auto": {"strategy": "auto"}}
    autos = ["auto"]
    if args.calibration:
        if not args.calibration.is_file():
            raise SystemExit(f"--calibration {args.calibration}: no such file")
        contenders["auto-calibrated"] = {"strategy": "auto", "auto_calibration": str(args.calibration.resolve())}
        autos.append("auto-calibrated")
    common = {"dataset": "orl-faces", "model": "facenet", "epochs": args.epochs, "target_accuracy": args.target,
              "stop_at_target": True}
    if args.report_only and (args.out is None or not args.out.is_dir()):
        raise SystemExit("--report-only needs --out DIR of an earlier run of this benchmark")
    out, results = run_matrix("auto", cells, contenders, args.repeats, common, args.out, args.first_seed,
                              repeat_major=True, run_missing=not args.report_only)
    results = {cell: runs for cell, runs in results.items() if all(runs.values())}  # cells a stopped run finished
    lines = [f"--strategy auto against its contenders: facenet / orl-faces / target {args.target:.0%} / runs stopped "
             f"at the target (at most {args.epochs} epochs) / {args.repeats} repeats (seeds {args.first_seed}..{args.first_seed + args.repeats - 1}), medians"]
    checks = []
    for cell, runs in results.items():
        console.print(table(f"{cell}: ratios to allreduce", runs, "allreduce"))
        for auto in autos:
            more, c = judge(cell, runs, auto)
            lines += more
            checks += c
    per_cell = list(checks)
    for auto in autos:
        picks = [ok for claim, ok, _ in per_cell if claim.split(": ")[1].startswith(f"{auto} (picked")]
        taus = [ok for claim, ok, _ in per_cell if f"{auto}'s prediction" in claim]
        checks.append((f"{auto} within 10% of the best measured in at least 80% of cells",
                       sum(picks) >= 0.8 * len(picks), f"{sum(picks)} of {len(picks)}"))
        checks.append((f"{auto}: Kendall tau >= 0.8 in every cell", all(taus), f"{sum(taus)} of {len(taus)}"))
    finish(out, lines, checks)


if __name__ == "__main__":
    guarded(main)
