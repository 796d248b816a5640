"""Benchmark: how the progress model's steps and pushes to the target move with the worker count.

The simulator predicts time-to-accuracy at worker counts this machine cannot run fast, from two
assumptions about progress: how allreduce's steps to the target fall as workers (and so the
global batch) are added, and what an asynchronous push is worth at the staleness more workers
bring. This measures both where they can be: facenet on ORL to 90%, allreduce and ps-async side
by side at each worker count (loopback, equal workers, seed = repeat; every count once before any
twice), then prints, per count, allreduce's steps and ps-async's pushes to the target, and how
well each form of the model predicts them, fitted on the smaller counts (extrapolation, as the
simulator is used) and on all (the shipped fit):

- steps: constant samples to the target (linear scaling, from the profile's steps at 4 workers)
  against the gradient noise scale's S_min x (1 + B / global batch) (`fit_dense_steps`);
- pushes: allreduce's steps x N over a push's worth 1 / (1 + a x s), each run's own staleness
  histogram, `a` fitted by `fit_staleness`.

    .venv/bin/python benchmarks/progress_by_workers.py --out runs/progress-n            # 2,3,4,8,12 x 4 seeds
    .venv/bin/python benchmarks/progress_by_workers.py --workers 2,4,8 --repeats 2 --fit-upto 4
    .venv/bin/python benchmarks/progress_by_workers.py --workers 2,3,4 --repeats 6 --first-seed 100
    ringps simulate --calibrate runs/progress-n/w*/*-r? --out cal.yaml                  # the fit, as a file
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from common import add_out_arg, console, guarded, run_matrix, write_report
from rich.table import Table

from ringps.sim.calibrate import Measured, read_run
from ringps.sim.predict import STALENESS_FORMS, Progress, dense_steps_at, load_progress, push_worth
from ringps.sim.progress_fit import async_reached, fit_dense_steps, fit_staleness, staleness_errors
from ringps.sim.workload import load_workload

CONTENDERS = {"allreduce": {"strategy": "allreduce"}, "ps-async": {"strategy": "ps-async"}}


def measured(runs: list[Measured]) -> tuple[dict, dict]:
    """Per worker count: allreduce's steps to the target; ps-async's runs that reached it."""
    counts = sorted({m.workers for m in runs})
    steps = {n: [m.steps_to_target for m in runs if m.strategy == "allreduce" and m.workers == n and m.steps_to_target]
             for n in counts}
    pushes = {n: [m for m in runs if m.strategy == "ps-async" and m.workers == n and (m.extra.get("to_target") or {}).get("pushes")]
              for n in counts}
    return steps, pushes


def mean_staleness(m: Measured) -> float:
    t = m.extra["to_target"]
    return sum(s * v for s, v in t["histogram"].items()) / t["pushes"]


def push_error(runs: list[Measured], n: int, a: float, form: str = "linear") -> list[float]:
    """Each ps-async run at n workers: predicted pushes (allreduce's steps of its seed x n over a
    push's worth at its own staleness histogram and drops) against measured, as a ratio - 1."""
    return [e for m, e in staleness_errors(runs, a, form) if m.workers == n and m.strategy == "ps-async"]


def fmt_err(errs: list[float]) -> str:
    return f"{statistics.median(errs):+.0%}" if errs else "-"


def report(out: Path, fit_upto: int) -> list[str]:
    runs = [read_run(d) for d in sorted(out.glob("w*/*-r*")) if (d / "summary.json").exists()]
    if not runs:
        raise SystemExit(f"{out}: no finished runs")
    steps, pushes = measured(runs)
    counts = sorted(steps)
    t = Table("workers", "allreduce steps to 90%", "ps-async pushes to 90%", "mean staleness", "a push's worth (x 1/N step)")
    for n in counts:
        worth = [need for m, _, _, need in async_reached(runs) if m.workers == n and m.strategy == "ps-async"]
        p = [m.extra["to_target"]["pushes"] for m in pushes[n]]
        t.add_row(str(n), f"{statistics.median(steps[n]):g} {steps[n]}" if steps[n] else "-",
                  f"{statistics.median(p):g} {p}" if p else "-",
                  f"{statistics.median(map(mean_staleness, pushes[n])):.2f}" if pushes[n] else "-",
                  f"{statistics.median(worth):.2f} [{min(worth):.2f}..{max(worth):.2f}]" if worth else "-")
    console.print(t)
    lines = [f"measured ({len(runs)} runs): workers, allreduce steps (median [runs]), ps-async pushes, mean staleness"]
    lines += [f"  {n}: {steps[n]}, {[m.extra['to_target']['pushes'] for m in pushes[n]]}, "
              f"{statistics.median(map(mean_staleness, pushes[n])) if pushes[n] else float('nan'):.2f}" for n in counts]

    w = load_workload("facenet").model_copy(update={"noise_batch": None})  # each model below states its own
    small = [m for m in runs if m.workers <= fit_upto]
    models = [("constant samples, the profile's steps at 4 workers", Progress(dense_steps=w.steps_to_target, workers_ref=4))]
    for name, part in ((f"noise scale fitted on <= {fit_upto} workers", small), ("noise scale fitted on all", runs)):
        d = fit_dense_steps(part)
        if d:
            models.append((f"{name}: {d}", Progress(workers_ref=d["workers_ref"], dense_steps=d["dense_steps"],
                                                    noise_batch=d.get("noise_batch"))))
    t = Table("allreduce steps to 90%: model", *[f"{n} workers" for n in counts])
    lines.append("allreduce steps to 90%, predicted (error against the median measured)")
    for name, prog in models:
        cells = [f"{dense_steps_at(n, w, prog):.1f} ({dense_steps_at(n, w, prog) / statistics.median(steps[n]) - 1:+.0%})"
                 if steps[n] else "-" for n in counts]
        t.add_row(name, *cells)
        lines.append(f"  {name}: " + ", ".join(f"{n}w {c}" for n, c in zip(counts, cells)))
    console.print(t)

    t = Table("ps-async pushes to 90%: staleness_a", *[f"{n} workers" for n in counts])
    lines.append("ps-async pushes to 90%, predicted from allreduce's steps x N and each run's staleness (median error)")
    fits = [("shipped", load_progress(None).staleness_a)]
    fits += [(f"fitted on <= {fit_upto} workers", fit_staleness(small)), ("fitted on all", fit_staleness(runs))]
    for name, a in fits:
        if a is None:
            continue
        cells = [fmt_err(push_error(runs, n, a)) for n in counts]
        t.add_row(f"{a:g} ({name})", *cells)
        lines.append(f"  a = {a:g} ({name}): " + ", ".join(f"{n}w {c}" for n, c in zip(counts, cells)))
    console.print(t)
    lines += staleness_forms(runs, counts)
    return lines


def staleness_forms(runs: list[Measured], counts: list[int]) -> list[str]:
    """The model's discount 1 / (1 + a x s) against two slower-growing ones (`staleness_form`),
    each fitted on every run: how well each holds from 2 to 12 workers, and what each says a push
    1,023 behind (1,024 workers) is worth: how far the measured range pins the form down."""
    names = {"linear": "a x s", "sqrt": "a x sqrt(s)", "log": "a x ln(1 + s)"}
    t = Table("discount 1 / (1 + ...), fitted on all", "a", *[f"{n} workers" for n in counts], "worth 1,023 behind")
    lines = ["ps-async pushes to 90% by the form of the staleness discount, each fitted on all (median error; worth 1,023 behind)"]
    for form in STALENESS_FORMS:
        a = fit_staleness(runs, form)
        if a is None:
            continue
        cells = [fmt_err(push_error(runs, n, a, form)) for n in counts]
        far = f"{push_worth({1023: 1}, 1.0, a, form):.3f}"
        t.add_row(names[form], f"{a:.4f}", *cells, far)
        lines.append(f"  {names[form]}: a = {a:.4f}: " + ", ".join(f"{n}w {c}" for n, c in zip(counts, cells)) + f"; {far}")
    console.print(t)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="2,3,4,8,12", help="worker counts, comma-separated")
    p.add_argument("--repeats", type=int, default=4, help="seeds per worker count (seed = repeat)")
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + repeats - 1 (seeds "
                   "apart from a validation's: benchmarks/auto_pick.py runs 0..5)")
    p.add_argument("--fit-upto", type=int, default=4, help="the extrapolation check fits on counts up to this")
    p.add_argument("--read", action="store_true", help="read --out's finished runs, run nothing")
    add_out_arg(p)
    args = p.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    out, _ = run_matrix("progress-n", {f"w{n}": {"workers": n} for n in counts}, CONTENDERS, args.repeats,
                        {"target_accuracy": 0.9, "stop_at_target": True}, args.out, args.first_seed, repeat_major=True,
                        run_missing=not args.read)
    write_report(out, "\n".join(report(out, args.fit_upto)) + "\n")


if __name__ == "__main__":
    guarded(main)
