"""Experiment: which weight function VSGD should use by default.

The setting of the parameter-server benchmark (facenet, orl-faces, 4 workers with slowdown
1,1,2,4, 1 server). First a run with weight `none` measures the value staleness d the pushes
really have (the distribution is printed: scales only mean something relative to it); then each
candidate NAME:SCALE runs with 3 seeds, side by side. The default is chosen among the weighing
candidates (`none` is the control: it only measures): those whose median time-to-accuracy is
within 5% of the best one's (closer than that is noise on this machine) are tied on speed, and
of those the highest median final accuracy wins (then the faster). docs/vsgd.md records the result.

    .venv/bin/python benchmarks/vsgd_weight.py --candidates inverse:0.01,exp:0.01,linear:0.02
    .venv/bin/python benchmarks/vsgd_weight.py --candidates relative:2,relative:2+vsgd_scope=push

A candidate NAME:SCALE+key=value adds an option (above: one weight per push instead of per tensor).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import add_out_arg, console, contenders_from, guarded, med, run_matrix, table, write_report

from ringps.record import read_rows


def distances(run_dir: str) -> list[float]:
    rows = read_rows(Path(run_dir) / "metrics.jsonl")
    return [r["value_staleness"] for r in rows if r["kind"] == "push" and r.get("value_staleness")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidates", default="none:1,inverse:0.01,exp:0.01,linear:0.02")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=20)
    add_out_arg(p)
    args = p.parse_args()
    contenders = contenders_from(args.candidates, lambda weight: {"strategy": "ps-vsgd", "vsgd_weight": weight})
    common = {"dataset": "orl-faces", "model": "facenet", "workers": 4, "servers": 1, "slowdown": "1,1,2,4",
              "epochs": args.epochs, "target_accuracy": 0.9}
    out, results = run_matrix("vsgd-weight", {"slowdown-1-1-2-4": {}}, contenders, args.repeats, common, args.out)
    runs = results["slowdown-1-1-2-4"]
    first = next(iter(runs))
    console.print(table("VSGD weight functions (ratios to the first)", runs, first))
    ds = sorted(d for r in runs[first] for d in distances(r["run_dir"]))
    lines = [f"VSGD weight experiment: {args.epochs} epochs of work, {args.repeats} seeds, medians"]
    if ds:
        q = lambda f: ds[min(len(ds) - 1, int(f * len(ds)))]  # noqa: E731
        lines.append(f"value staleness d of the pushes ({first}): median {q(0.5):.4g}, p90 {q(0.9):.4g}, "
                     f"p99 {q(0.99):.4g}, max {ds[-1]:.4g} ({len(ds)} pushes)")
    tta = {c: med(rs, "time_to_accuracy_s") or float("inf") for c, rs in runs.items() if not c.startswith("none")}
    fast = min(tta.values(), default=float("inf"))
    score = {c: (-(med(runs[c], "final_accuracy") or 0), t) for c, t in tta.items() if t <= 1.05 * fast}
    for c, rs in runs.items():
        lines.append(f"{c}: time-to-accuracy {med(rs, 'time_to_accuracy_s')}, final {med(rs, 'final_accuracy')}, "
                     f"spikes {med(rs, 'loss_spikes')}, dropped {med(rs, 'pushes_dropped')}")
    best = min(score, key=score.get) if score else first
    lines.append(f"tied on speed (median time-to-accuracy within 5% of {fast:.1f}s): {', '.join(sorted(score))}")
    lines.append(f"best: {best}")
    for line in lines:
        console.print(line)
    write_report(out, "\n".join(lines) + "\n")
    (out / "distances.json").write_text(json.dumps(ds))


if __name__ == "__main__":
    guarded(main)
