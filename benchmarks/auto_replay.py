"""Replay `--strategy auto`'s saved plans with other progress factors, or ranked again by the
engine as it is now: the tau and the pick each sitting of benchmarks/auto_pick.py would have had,
without running anything.

A synchronous strategy's predicted time to the target is its step time x dense steps / its factor
(ringps/sim/predict.py), so a new factor f' scales every candidate of that strategy (its variants
are priced with its factor, ringps/sim/auto.py) by f / f'. The plans are those auto wrote at the
sittings' start (`<cell>-auto-plan.json` beside `results.json`), the measured times the sittings'
medians, judged as auto_pick.py judges them (its Kendall's tau and contender labels).

`--rerank` prices every candidate again with this code's engine and shipped progress model on each
plan's own cluster and selection costs (what auto measured at the sitting; the parameter servers'
compute from the step it measured outside DDP; for a plan from before 2026-12-08, what auto now
derives from its start-up measurement: the synchronous steps' wait to line up and ring-topk's
planning compute, `--as-priced` leaves them out): a change to the engine or the progress model,
replayed on the sittings it would have ranked. `--hook-costs` prices ring-topk's selection with
the costs its hook measured in the cell's runs, where the plans' were timed with more threads.

    .venv/bin/python benchmarks/auto_replay.py --factor fp16=1.0 --factor powersgd=0.846 docs/results/auto-pick-1207*
    .venv/bin/python benchmarks/auto_replay.py --priced fp16=1.083 --factor fp16=1.0 docs/results/auto-pick-1207
    .venv/bin/python benchmarks/auto_replay.py --rerank docs/results/auto-pick-1207-{6,7,8,9,10}
    .venv/bin/python benchmarks/auto_replay.py --rerank --progress cal.yaml docs/results/auto-pick-1207-*
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from auto_pick import RANKED_AS, predicted_tau  # noqa: E402
from common import med  # noqa: E402

from ringps.sim.auto import RESOLUTION, recommend  # noqa: E402
from ringps.sim.predict import load_progress  # noqa: E402


def factors(specs: list[str]) -> dict[str, float]:
    out = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"--factor {spec}: give STRATEGY=NUMBER, e.g. fp16=1.0") from None
    return out


def replay(plan: dict, old: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """The plan's predicted times with `new` factors in place of `old` ones."""
    out = {}
    for e in plan["ranking"]:
        base = e["strategy"].split(" (")[0]
        scale = old.get(base, 1.0) / new[base] if base in new else 1.0
        out[e["strategy"]] = e["time_to_accuracy_s"] * scale
    return out


def hook_costs(runs: dict[str, list[dict]]) -> Optional[dict[str, float]]:
    """The per-element costs ring-topk's hook measured at its runs' start in this cell (medians over
    its runs' rank 0; `strategy_stats.rank0.cost_params`): what auto measures since 2026-12-08,
    with the workers' threads, where the plans' were timed with the launcher's thread per core."""
    got = [p for r in runs.get("ring-topk", []) if (p := ((r.get("strategy_stats") or {}).get("rank0") or {}).get("cost_params"))]
    # the per-element ones, as auto-plan.json's selection_costs keeps them (launch/run.py auto_plan)
    return {k: statistics.median(p[k] for p in got) for k in got[0] if k.endswith("_s")} if got else None


def rerank(plan: dict, progress: Optional[Path] = None, now: bool = True,
           selection: Optional[dict[str, float]] = None) -> dict[str, float]:
    """The plan's predicted times, every candidate ranked again by this code's engine on the plan's
    cluster and selection costs (the servers' on their workers' cluster, `ps_cluster`); `now`:
    what auto derives from its start-up measurement since 2026-12-08, for a plan from before it:
    its synchronous steps charged the measured DDP step's wait beyond the model's (sim/auto.py
    `sync_wait`) and ring-topk's choices planned with the step measured outside DDP
    (`Options.plan_compute_s`); False: as it was priced; `selection`: per-element costs in place
    of the plan's (`hook_costs`)."""
    from ringps.cost import CostParams
    from ringps.sim.auto import rank, sync_wait
    from ringps.sim.cluster import ClusterSpec
    from ringps.sim.engine import Options
    from ringps.sim.predict import load_calibration
    from ringps.sim.workload import load_workload

    if "selection_costs" not in plan:
        raise SystemExit("--rerank: a plan without selection_costs (written before 749a852) cannot be ranked again")
    w = load_workload("facenet")
    prog = load_calibration(progress, "--progress")
    c = ClusterSpec(**plan["cluster"])
    m = plan["measured_step"]
    if now and "sync_wait_s" not in plan["cluster"] and m and m.get("sync_step_s"):  # as auto prices it since 2026-12-08
        loopback = c.model_copy(update={"workers": m["processes"], "net": "10gbit", "slowdown": None})
        c = c.model_copy(update={"sync_wait_s": sync_wait(m["sync_step_s"], loopback, w, prog)})
    base = Options(plan_compute_s=m["compute_s"] if now and m else None)
    choices = rank(w, c, prog, base=base, ps_cluster=ps_cluster(plan),
                   selection_cpu=CostParams(**(selection or plan["selection_costs"])))
    return {e["strategy"]: e["time_to_accuracy_s"] for e in plan["ranking"]} | {c.label(): c.tta for c in choices}


def ps_cluster(plan: dict):
    """The cluster a parameter-server worker computed on in the plan, as ringps.launch.run built it:
    the plan's, its compute the step measured outside DDP (`measured_step.compute_s`, as many
    processes at once as shared the cores), per whole core, over the profile's, and no DDP split."""
    from ringps.sim.cluster import ClusterSpec

    c, m = {**plan["cluster"], "sync_wait_s": 0.0}, plan["measured_step"]
    per_core = m["compute_s"] / max(1.0, m.get("processes", 1) / c["shared_cores"]) / m["profile_compute_s"]
    return ClusterSpec(**{**c, "compute_scale": per_core, "forward_share": None, "optimizer_share": None})


def judge(measured: dict[str, float], predicted: dict[str, float], resolution: float = 0.0) -> tuple[float, str, float]:
    """Kendall's tau of the contenders (auto_pick.py's), the pick (`recommend`'s at `resolution`; 0,
    the fastest, as auto chose before 2026-12-08), and the pick's measured time over the best's."""
    tau, _ = predicted_tau(measured, predicted)
    pick = recommend(predicted, resolution)
    got = measured.get(pick.split(" (")[0])
    return tau, pick, (got / min(measured.values())) if got else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sittings", nargs="+", type=Path, help="folders with results.json and <cell>-auto-plan.json")
    p.add_argument("--factor", action="append", default=[], help="STRATEGY=NUMBER, repeatable")
    p.add_argument("--priced", action="append", default=[], help="STRATEGY=NUMBER: a factor the plans were priced "
                   "with, where it is not the shipped one (plans before 2026-12-08: fp16=1.083 powersgd=0.917 "
                   "localsgd=0.867 topk-allgather=0.88; ring-topk's allgather 0.88), repeatable")
    p.add_argument("--rerank", action="store_true", help="rank every candidate again with this code's engine and progress model")
    p.add_argument("--resolution", type=float, default=None, help="the replay's picks at this --auto-resolution "
                   "(default the shipped 0.05; the saved plans chose the fastest)")
    p.add_argument("--as-priced", action="store_true", help="--rerank a plan from before 2026-12-08 without what "
                   "auto now derives from its start-up measurement (the synchronous steps' wait to line up, ring-topk's "
                   "planning compute): as it was priced")
    p.add_argument("--hook-costs", action="store_true", help="--rerank with the selection costs ring-topk's hook "
                   "measured in the cell's runs (what auto measures since 2026-12-08, with the workers' threads), not "
                   "the plan's")
    p.add_argument("--progress", type=Path, help="--rerank with this progress model (`ringps simulate --progress`'s file), "
                   "not the shipped one")
    args = p.parse_args()
    new = factors(args.factor)
    old = load_progress(None).factor | factors(args.priced)  # the factors the plans were priced with
    if args.rerank and new:
        raise SystemExit("--rerank prices with the shipped factors; give --factor or --rerank, not both")
    if (args.progress or args.as_priced or args.hook_costs) and not args.rerank:
        raise SystemExit("--progress FILE, --as-priced and --hook-costs: only with --rerank")
    print(f"ranked again by this code's engine, progress {args.progress or 'shipped'}" if args.rerank
          else f"shipped {({k: old.get(k, 1.0) for k in new})} -> replayed {new}")
    resolution = RESOLUTION if args.resolution is None else args.resolution
    ratios: dict[str, list[float]] = {"synchronous": [], "parameter-server": []}  # measured / predicted
    for sitting in args.sittings:
        results = json.loads((sitting / "results.json").read_text())
        for cell, runs in results.items():
            plan_file = sitting / f"{cell}-auto-plan.json"
            if not plan_file.is_file():
                continue
            plan = json.loads(plan_file.read_text())
            # as auto_pick.py: medians over every run (one that missed the target counts as slowest)
            measured = {c: t for c, rs in runs.items() if not c.startswith("auto")
                        if (t := med(rs, "time_to_accuracy_s")) is not None}
            saved = {e["strategy"]: e["time_to_accuracy_s"] for e in plan["ranking"]}
            again = (rerank(plan, args.progress, not args.as_priced, hook_costs(runs) if args.hook_costs else None)
                     if args.rerank else replay(plan, old, new))
            before, after = judge(measured, saved), judge(measured, again, resolution)
            print(f"{sitting.name:20s} {cell:18s} tau {before[0]:.2f} -> {after[0]:.2f}   "
                  f"pick {before[1]} ({before[2]:.2f}x, predicted {saved[before[1]]:.1f} s) -> "
                  f"{after[1]} ({after[2]:.2f}x, predicted {again[after[1]]:.1f} s)")
            for c, t in measured.items():  # each contender against its setting's prediction (auto_pick's labels)
                if (p := again.get(RANKED_AS.get(c, c))) is not None:
                    ratios["parameter-server" if c.startswith("ps-") else "synchronous"].append(t / p)
    for kind, r in ratios.items():
        if r:
            print(f"{kind} contenders' time to the target, measured over predicted: median {statistics.median(r):.3f}, "
                  f"|error| median {100 * statistics.median([abs(x - 1) for x in r]):.1f}%, within 15% {sum(abs(x - 1) <= 0.15 for x in r)} "
                  f"of {len(r)}")


if __name__ == "__main__":
    main()
