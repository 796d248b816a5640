"""Benchmark: a parameter server's memory and throughput against the number of workers, for one
or several policies, this tree's code alone or side by side with an earlier commit's (`--baseline
REF`, checked out into a temporary git worktree and run from there).

Each cell runs `ringps.bench.ps` (W workers push-and-pull a flat parameter as fast as they can,
one server) for both trees in turn, `--repeats` times; the server's peak resident memory is the
largest descendant's ru_maxrss (the server holds the shard copies, it is the largest process).

    .venv/bin/python benchmarks/ps_memory.py --baseline 1ea381c --workers 4,16 --params 1e7 --repeats 3
    .venv/bin/python benchmarks/ps_memory.py --policy async,threshold,stale-lr,vsgd,dcasgd --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import add_out_arg, console, guarded
from rich.table import Table

from ringps.ps import POLICIES

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import importlib.util, json, resource, sys
from ringps.launch.spawn import run_module
module = "ringps.bench.ps" if importlib.util.find_spec("ringps.bench") else "ringps.ps.bench"  # older trees
res = run_module(module, sys.argv[2:], int(sys.argv[1]), None, timeout=600)
server = next(r for r in res if r.get("role") == "server")
print(json.dumps({"pushes_per_s": server["pushes_per_s"],
                  "peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def measure(tree: Path, workers: int, params: float, seconds: float, policy: str) -> dict:
    env_path = str(tree)
    out = subprocess.run([sys.executable, "-c", PROBE, str(workers + 1), "--params", str(params), "--seconds",
                          str(seconds), "--policy", policy], cwd=tempfile.gettempdir(), capture_output=True, text=True,
                         env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: {(out.stderr or out.stdout).strip().splitlines()[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="git ref of the code to compare against (omit: this tree only)")
    p.add_argument("--workers", default="4,16")
    p.add_argument("--params", type=float, default=1e7)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--policy", default="async", help="one or several, comma-separated: each measured in turn")
    p.add_argument("--repeats", type=int, default=3)
    add_out_arg(p)
    args = p.parse_args()
    policies, ws = args.policy.split(","), sorted(int(x) for x in args.workers.split(","))
    holding = [name for name in policies if POLICIES.get(name).holds()]
    if holding:  # as `ringps bench ps`: workers stop on their own clocks, and a held push would wait for ever
        raise SystemExit(f"--policy {','.join(holding)}: the throughput bench needs policies where no push waits for another")
    trees = [("this tree", ROOT)]
    if args.baseline:
        base = Path(tempfile.mkdtemp(prefix="ringps-baseline-"))
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline], check=True,
                       capture_output=True)
        trees.insert(0, ("baseline", base))
    rows: dict = {}
    try:
        for rep in range(args.repeats):
            for policy in policies:
                for w in ws:
                    for label, tree in trees:
                        r = measure(tree, w, args.params, args.seconds, policy)
                        rows.setdefault((policy, w, label), []).append(r)
                        console.print(f"repeat {rep}, {policy}, {w} workers, {label}: {r['pushes_per_s']:.1f} pushes/s, "
                                      f"peak {r['peak_rss'] / 1e6:.0f} MB")
    finally:
        if args.baseline:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    report(rows, args, policies, ws)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({f"{pol}/{w}/{label}": v for (pol, w, label), v in rows.items()},
                                                          indent=1))


def report(rows: dict, args: argparse.Namespace, policies: list[str], ws: list[int]) -> None:
    """The table, then the bars: memory flat in the workers (each policy), throughput no lower than the baseline's."""
    t = Table("policy", "workers", "code", r"pushes/s (median \[min..max])", "server peak RSS MB", "ratio pushes/s",
              "ratio RSS")
    med = {k: (statistics.median(r["pushes_per_s"] for r in v), statistics.median(r["peak_rss"] for r in v))
           for k, v in rows.items()}
    for (pol, w, label), v in rows.items():
        pps = [r["pushes_per_s"] for r in v]
        m = med[(pol, w, label)]
        b = med.get((pol, w, "baseline"), m)
        t.add_row(pol, str(w), label, f"{m[0]:.1f} [{min(pps):.1f}..{max(pps):.1f}]", f"{m[1] / 1e6:.0f}",
                  f"{m[0] / b[0]:.2f}x", f"{m[1] / b[1]:.2f}x")
    console.print(f"{args.params:.0e} parameters, {args.seconds:g}s per cell, {args.repeats} repeats (interleaved)"
                  + (f", baseline {args.baseline}" if args.baseline else ""))
    console.print(t)
    lo, hi = ws[0], ws[-1]
    for pol in policies:
        grow = med[(pol, hi, "this tree")][1] / med[(pol, lo, "this tree")][1]
        note = " (keeps a shard copy per worker: not bound by this bar)" if pol == "dcasgd" else ""
        console.print(f"bar: {pol}: server peak at {hi} workers <= its {lo}-worker figure + 10%: "
                      f"{grow:.3f}x -> {'met' if grow <= 1.10 else 'MISSED'}{note}")
        for w in ws if args.baseline else []:
            r = med[(pol, w, "this tree")][0] / med[(pol, w, "baseline")][0]
            console.print(f"bar: {pol}: pushes/s at {w} workers no lower than the baseline's: {r:.3f}x -> "
                          f"{'met' if r >= 1.0 else 'MISSED (within noise?)'}")


if __name__ == "__main__":
    guarded(main)
