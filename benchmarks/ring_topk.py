"""Benchmark: ring-topk against DDP all-reduce, PowerSGD and the top-k all-gather peer.

facenet on orl-faces, 4 workers, each in its own emulated host; links at 100 Mbit/s (the
headline), 1 Gbit/s, and unshaped loopback. 3 repeats (seeds 0, 1, 2), medians, ratios to
allreduce, and the bars of the ring-topk issue checked against the medians.

    .venv/bin/python benchmarks/ring_topk.py                       # everything (about 3 hours)
    .venv/bin/python benchmarks/ring_topk.py --settings 100mbit --repeats 1 --epochs 10
"""

from __future__ import annotations

import argparse

from common import add_out_arg, console, guarded, med, run_matrix, table, verdict, write_report

SETTINGS = {"100mbit": {"net": "100mbit"}, "1gbit": {"net": "1gbit"}, "unshaped": {}}
CONTENDERS = {"allreduce": {"strategy": "allreduce"}, "powersgd": {"strategy": "powersgd"},
              "topk-allgather": {"strategy": "topk-allgather"}, "ring-topk": {"strategy": "ring-topk"}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default=",".join(SETTINGS))
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--target", type=float, default=0.9)
    add_out_arg(p)
    args = p.parse_args()
    settings = {s: SETTINGS[s] for s in args.settings.split(",")}
    contenders = {c: CONTENDERS[c] for c in args.contenders.split(",")}
    common = {"dataset": "orl-faces", "model": "facenet", "workers": 4, "epochs": args.epochs,
              "target_accuracy": args.target}
    out, results = run_matrix("ring-topk", settings, contenders, args.repeats, common, args.out)
    lines = [f"ring-topk benchmark: facenet / orl-faces / 4 workers / {args.epochs} epochs / target "
             f"{args.target:.0%} / {args.repeats} repeats (seeds 0..{args.repeats - 1}), medians [min..max]"]
    for s, runs in results.items():
        console.print(table(f"{s}: ratios to allreduce", runs, "allreduce"))
        checks = []
        rt, ar, ps = runs.get("ring-topk"), runs.get("allreduce"), runs.get("powersgd")
        if rt and ar:
            tta_rt, tta_ar = med(rt, "time_to_accuracy_s"), med(ar, "time_to_accuracy_s")
            acc_rt, acc_ar = med(rt, "final_accuracy"), med(ar, "final_accuracy")
            u_rt, u_ar = med(rt, "utilization"), med(ar, "utilization")
            w_rt, w_ar = med(rt, "wall_s"), med(ar, "wall_s")
            if s == "100mbit" and None not in (tta_rt, tta_ar):
                checks.append(("time-to-accuracy <= 0.4x allreduce", tta_rt <= 0.4 * tta_ar,
                               f"{tta_rt:.0f}s vs {tta_ar:.0f}s = {tta_rt / tta_ar:.2f}x"))
                tta_ps = med(ps, "time_to_accuracy_s") if ps else None
                if tta_ps is not None:
                    checks.append(("no later than powersgd", tta_rt <= tta_ps, f"{tta_rt:.0f}s vs {tta_ps:.0f}s"))
                checks.append(("utilization >= 2x allreduce", u_rt >= 2 * u_ar, f"{u_rt:.1%} vs {u_ar:.1%} = {u_rt / u_ar:.2f}x"))
            if s in ("100mbit", "1gbit", "unshaped") and None not in (acc_rt, acc_ar):
                checks.append((f"{s}: final accuracy within 1 point of allreduce", acc_rt >= acc_ar - 0.01,
                               f"{acc_rt:.1%} vs {acc_ar:.1%}"))
            if s == "1gbit":
                checks.append(("1gbit: at most 5% slower than allreduce (wall, same epochs)", w_rt <= 1.05 * w_ar,
                               f"{w_rt:.0f}s vs {w_ar:.0f}s = {w_rt / w_ar:.2f}x"))
            if s == "unshaped":
                checks.append(("unshaped: wall relative to allreduce (reported, no bar)", True,
                               f"{w_rt:.0f}s vs {w_ar:.0f}s = {w_rt / w_ar:.2f}x"))
            chosen = {}
            for r in rt:
                for k, v in ((r.get("strategy_stats") or {}).get("rank0", {}).get("exchanges_chosen") or {}).items():
                    chosen[k] = chosen.get(k, 0) + v
            lines.append(f"{s}: exchanges ring-topk's cost model chose (buckets, all repeats): {chosen}")
        for line in verdict(checks):
            console.print(line)
            lines.append(line)
    write_report(out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    guarded(main)
