"""Benchmark: staleness control on the parameter server, in a homogeneous and a heterogeneous cluster.

facenet on orl-faces, 4 workers, 1 server, loopback: every policy side by side (interleaved by
seed) with --slowdown 1,1,1,1 (homogeneous) and 1,1,2,4 (heterogeneous), 5 seeds, medians
[min..max], ratios to ps-sync, a table per environment and the parameter-server issue's bars
checked against the medians. The `layers` setting runs ps-vsgd, ps-threshold and ps-async with
--layer-strategy auto, and ps-vsgd without it, each worker and the server in its own host behind
a 100 Mbit/s link, heterogeneous, 3 seeds.

    .venv/bin/python benchmarks/ps_staleness.py                                   # both environments
    .venv/bin/python benchmarks/ps_staleness.py --settings layers --repeats 3 --epochs 8
    .venv/bin/python benchmarks/ps_staleness.py --settings layers --contenders ps-vsgd+layer_strategy=auto --epochs 30
    .venv/bin/python benchmarks/ps_staleness.py --contenders ps-sync,ps-vsgd --repeats 1 --epochs 5
    .venv/bin/python benchmarks/ps_staleness.py --contenders ps-dcasgd,ps-dcasgd+dcasgd_lambda=0   # variants
"""

from __future__ import annotations

import argparse

from common import add_out_arg, console, contenders_from, finish, guarded, med, run_matrix, table

CONTENDERS = ["ps-sync", "ps-async", "ps-threshold", "ps-ssp", "ps-stale-lr", "ps-dcasgd", "ps-vsgd"]
ENVIRONMENTS = {"homogeneous": "1,1,1,1", "heterogeneous": "1,1,2,4"}
# ps-vsgd without the layer strategy pushes the whole 43 MB model through the server's 100 Mbit/s link
# every step (~20 s a step): 3 epochs of it bound its time-to-accuracy from below (its training time)
LAYERS = "ps-vsgd+layer_strategy=auto,ps-threshold+layer_strategy=auto,ps-async+layer_strategy=auto,ps-vsgd+epochs=3"
OFF = "ps-vsgd+epochs=3"


def reached(rs: list[dict]) -> str:
    return f"reached the target in {sum(r.get('time_to_accuracy_s') is not None for r in rs)} of {len(rs)} seeds"


def time_bar(checks: list, claim: str, runs: dict, a: str, b: str, factor: float) -> None:
    """a's median time-to-accuracy <= factor x b's (a median a never reached is a miss, not a skip)."""
    if a not in runs or b not in runs:
        return
    ta, tb = med(runs[a], "time_to_accuracy_s"), med(runs[b], "time_to_accuracy_s")
    if ta is None:
        checks.append((claim, False, f"{a} {reached(runs[a])}"))
    elif tb is None:  # b never got there: its training time is a lower bound on its time-to-accuracy
        wall = med(runs[b], "wall_s")
        checks.append((claim, ta <= factor * wall, f"{ta:.1f}s vs more than {wall:.1f}s ({b} {reached(runs[b])} within "
                                                   f"its {wall:.0f}s of training) = under {ta / wall:.3f}x"))
    else:
        checks.append((claim, ta <= factor * tb, f"{ta:.1f}s vs {tb:.1f}s = {ta / tb:.3f}x"))


def describe(env: str, runs: dict, lines: list) -> None:
    for c, rs in runs.items():
        lines.append(f"{env} / {c}: median time-to-accuracy {med(rs, 'time_to_accuracy_s')} ({reached(rs)}), final "
                     f"{med(rs, 'final_accuracy')}, spikes {med(rs, 'loss_spikes')}, setbacks {med(rs, 'accuracy_setbacks')}, "
                     f"dropped {med(rs, 'pushes_dropped')}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="homogeneous,heterogeneous", help="homogeneous, heterogeneous, layers")
    p.add_argument("--contenders", default=None,
                   help="comma-separated; NAME+key=value adds an option (a variant: ps-dcasgd+dcasgd_lambda=0); default: "
                   "every policy, and for the layers setting its four (given, they run there beside ps-vsgd off)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + repeats - 1 "
                   "(an experiment that picks a default runs on other seeds than the bar)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--extra", default="", help="more options for every run, as key=value,key=value")
    add_out_arg(p)
    args = p.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.extra.split(",") if kv)
    common = {"dataset": "orl-faces", "model": "facenet", "workers": 4, "servers": 1, "epochs": args.epochs,
              "target_accuracy": args.target, **extra}
    wanted = args.settings.split(",")
    envs = {e: {"slowdown": ENVIRONMENTS[e]} for e in wanted if e in ENVIRONMENTS}
    lines = [f"parameter-server benchmark: facenet / orl-faces / 4 workers / 1 server / {args.epochs} epochs of work / "
             f"target {args.target:.0%} / seeds {args.first_seed}..{args.first_seed + args.repeats - 1}, medians"]
    checks: list = []
    out = args.out
    if envs:
        contenders = contenders_from(args.contenders or ",".join(CONTENDERS), lambda name: {"strategy": name})
        out, results = run_matrix("ps-staleness", envs, contenders, args.repeats, common, args.out, args.first_seed)
        for env, runs in results.items():
            ref = "ps-sync" if "ps-sync" in runs else next(iter(runs))
            console.print(table(f"{env} (--slowdown {ENVIRONMENTS[env]}): ratios to {ref}", runs, ref))
            describe(env, runs, lines)
        het, hom = results.get("heterogeneous", {}), results.get("homogeneous", {})
        for c in ("ps-threshold", "ps-vsgd"):
            time_bar(checks, f"heterogeneous: {c} time-to-accuracy <= 0.7x ps-sync", het, c, "ps-sync", 0.7)
            if c in het and "ps-async" in het and None not in (med(het[c], "final_accuracy"), med(het["ps-async"], "final_accuracy")):
                a, b = med(het[c], "final_accuracy"), med(het["ps-async"], "final_accuracy")
                checks.append((f"heterogeneous: {c} median final accuracy >= ps-async's", a >= b, f"{a:.1%} vs {b:.1%}"))
            time_bar(checks, f"homogeneous: {c} no more than 10% slower than ps-async to the target", hom, c,
                     "ps-async", 1.1)
    if "layers" in wanted:
        layer_runs = contenders_from(f"{args.contenders},{OFF}" if args.contenders else LAYERS, lambda name: {"strategy": name})
        lout, lres = run_matrix("ps-layers", {"layers-100mbit": {"net": "100mbit", "slowdown": "1,1,2,4"}}, layer_runs,
                                args.repeats, common, (out / "layers") if out else None, args.first_seed)
        runs = lres["layers-100mbit"]
        console.print(table("layer strategy at 100 Mbit/s, heterogeneous: ratios to ps-vsgd (off)", runs, OFF))
        describe("layers-100mbit", runs, lines)
        time_bar(checks, "100 Mbit/s, heterogeneous: ps-vsgd with the layer strategy <= 0.5x without it", runs,
                 "ps-vsgd+layer_strategy=auto", OFF, 0.5)
        out = out or lout
    finish(out, lines, checks)


if __name__ == "__main__":
    guarded(main)
