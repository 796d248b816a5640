"""Benchmark: the layer-aware strategy on a congested parameter server.

facenet on orl-faces, 4 workers and 1 server, each in its own emulated host; every push and
pull crosses the server's link. ps-async with --layer-strategy auto against the same run with
off, at 100 Mbit/s and 1 Gbit/s, 3 seeds: median step time, final accuracy, and the plan's
predicted step time (plan.json of each run) against the measured one.

    .venv/bin/python benchmarks/layer_strategy.py
    .venv/bin/python benchmarks/layer_strategy.py --settings 1gbit --repeats 1 --epochs 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import add_out_arg, console, finish, guarded, med, run_matrix, table

SETTINGS = {"100mbit": {"net": "100mbit"}, "1gbit": {"net": "1gbit"}}
CONTENDERS = {"off": {"layer_strategy": "off"}, "auto": {"layer_strategy": "auto"}}


def predicted(run: dict, which: str) -> float | None:
    f = Path(run["run_dir"]) / "plan.json"
    return json.loads(f.read_text())[which]["predicted"]["step_s"] if f.is_file() else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=15)
    add_out_arg(p)
    args = p.parse_args()
    settings = {s: SETTINGS[s] for s in args.settings.split(",")}
    common = {"strategy": "ps-async", "dataset": "orl-faces", "model": "facenet", "workers": 4, "servers": 1,
              "epochs": args.epochs, "target_accuracy": 0.9}
    out, results = run_matrix("layer-strategy", settings, CONTENDERS, args.repeats, common, args.out)
    lines = [f"layer-strategy benchmark: ps-async / facenet / orl-faces / 4 workers + 1 server, each its own host / "
             f"{args.epochs} epochs of work / {args.repeats} seeds, medians"]
    checks = []
    for s, runs in results.items():
        console.print(table(f"{s}: ratios to off", runs, "off"))
        off, auto = med(runs["off"], "step_s_median"), med(runs["auto"], "step_s_median")
        acc_off, acc_auto = med(runs["off"], "final_accuracy"), med(runs["auto"], "final_accuracy")
        lines.append(f"{s}: median step time off {off:.2f}s, auto {auto:.2f}s; final accuracy off {acc_off:.1%}, auto {acc_auto:.1%}")
        if s == "100mbit":
            checks.append(("100mbit: auto median step time <= 0.5x off", auto <= 0.5 * off,
                           f"{auto:.2f}s vs {off:.2f}s = {auto / off:.2f}x"))
            checks.append(("100mbit: auto final accuracy within 1 point of off", acc_auto >= acc_off - 0.01,
                           f"{acc_auto:.1%} vs {acc_off:.1%}"))
        for label, which in (("auto", "auto"), ("off", "off")):
            preds = [predicted(r, which) for r in runs[label]]
            preds = [x for x in preds if x is not None]
            measured = med(runs[label], "step_s_median")
            if preds and measured:
                pr = sorted(preds)[len(preds) // 2]
                err = abs(pr - measured) / measured
                checks.append((f"{s}: plan's predicted step time ({label}) within 25% of measured", err <= 0.25,
                               f"predicted {pr:.2f}s, measured {measured:.2f}s ({err:.0%} off)"))
    finish(out, lines, checks)


if __name__ == "__main__":
    guarded(main)
