"""Benchmark: a parameter server's memory and throughput against the number of workers, this
tree's code side by side with an earlier commit's (`--baseline REF`, checked out into a temporary
git worktree and run from there).

Each cell runs `ringps.bench.ps` (W workers push-and-pull a flat parameter as fast as they can,
one server) for both trees in turn, `--repeats` times; the server's peak resident memory is the
largest descendant's ru_maxrss (the server holds the shard copies, it is the largest process).

    .venv/bin/python benchmarks/ps_memory.py --baseline 1ea381c --workers 4,16 --params 1e7 --repeats 3
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
    p.add_argument("--baseline", required=True, help="git ref of the code to compare against")
    p.add_argument("--workers", default="4,16")
    p.add_argument("--params", type=float, default=1e7)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--policy", default="async")
    p.add_argument("--repeats", type=int, default=3)
    add_out_arg(p)
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ringps-baseline-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline], check=True,
                   capture_output=True)
    rows: dict = {}
    try:
        for rep in range(args.repeats):
            for w in [int(x) for x in args.workers.split(",")]:
                for label, tree in (("baseline", base), ("this tree", ROOT)):
                    r = measure(tree, w, args.params, args.seconds, args.policy)
                    rows.setdefault((w, label), []).append(r)
                    console.print(f"repeat {rep}, {w} workers, {label}: {r['pushes_per_s']:.1f} pushes/s, "
                                  f"peak {r['peak_rss'] / 1e6:.0f} MB")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    t = Table("workers", "code", "pushes/s (median [min..max])", "server peak RSS MB", "ratio pushes/s", "ratio RSS")
    med = {k: (statistics.median(r["pushes_per_s"] for r in v), statistics.median(r["peak_rss"] for r in v))
           for k, v in rows.items()}
    for (w, label), v in rows.items():
        pps = [r["pushes_per_s"] for r in v]
        b = med[(w, "baseline")]
        t.add_row(str(w), label, f"{med[(w, label)][0]:.1f} [{min(pps):.1f}..{max(pps):.1f}]",
                  f"{med[(w, label)][1] / 1e6:.0f}", f"{med[(w, label)][0] / b[0]:.2f}x", f"{med[(w, label)][1] / b[1]:.2f}x")
    console.print(f"{args.params:.0e} parameters, policy {args.policy}, {args.seconds:g}s per cell, "
                  f"{args.repeats} repeats (interleaved), baseline {args.baseline}")
    console.print(t)
    ws = sorted({w for w, _ in rows})
    lo, hi = ws[0], ws[-1]
    grow = med[(hi, "this tree")][1] / med[(lo, "this tree")][1]
    console.print(f"bar: this tree's server peak at {hi} workers <= its {lo}-worker figure + 10%: "
                  f"{grow:.3f}x -> {'met' if grow <= 1.10 else 'MISSED'}")
    for w in ws:
        r = med[(w, "this tree")][0] / med[(w, "baseline")][0]
        console.print(f"bar: pushes/s at {w} workers no lower than the baseline's: {r:.3f}x -> "
                      f"{'met' if r >= 1.0 else 'MISSED (within noise?)'}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({f"{w}/{label}": v for (w, label), v in rows.items()}, indent=1))


if __name__ == "__main__":
    guarded(main)
