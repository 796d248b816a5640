"""The progress of a step through the sparse exchanges that send every rank's own top k
(allgather, sparse-rs, gloo-allgather), fitted from runs stopped at the target.

Each run that sent at least `--min-share` of its buckets through them is paired with the
allreduce run of the same seed in the same setting; its factor is allreduce's steps to the target
over its own, with the buckets it sent otherwise (dense, shared-index) taken at a dense step's
progress, as `ringps simulate --calibrate` does (sim/progress_fit.sparse_factor): r = 1 - (1 - r) / share.
The median over every run is the progress model's `sparse` value of the three
(sim/profiles/progress.yaml): one update, every rank's own k summed, whatever moves it. Its
sources (the default) are ring-topk's runs with the exchange forced at seeds 100-105, apart from
the seeds the validation runs; `Exchange.progress` of the three (0.88, which the hook chooses
with) came from OLD_SOURCES, 9 of whose 20 runs are a sitting of the auto_pick grid itself.

    .venv/bin/python benchmarks/sparse_progress.py            # the shipped value's sources
    .venv/bin/python benchmarks/sparse_progress.py --before   # Exchange.progress's (0.88)
    .venv/bin/python benchmarks/sparse_progress.py R.json ...  # other run_matrix results files
    .venv/bin/python benchmarks/sparse_progress.py --exchanges shared-index docs/results/progress-seeds100/w4/results.json

Reads results.json files written by benchmarks' run_matrix (every contender's runs, in seed order).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ringps.sim.calibrate import sparse_share
from ringps.sim.progress_fit import sparse_factor

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [  # ring-topk with exchange=allgather at 2, 3 and 4 workers, seeds 100-105, loopback, 30 epochs
    "docs/results/progress-seeds100/w2rt/results.json",
    "docs/results/progress-seeds100/w3rt/results.json",
    "docs/results/progress-seeds100/w4rt/results.json",
]
OLD_SOURCES = [  # every sitting on facenet / ORL before 2026-12-08 whose runs stopped at 90% and sent their own top k
    "docs/results/ring-topk-1gbit-30b/results.json",  # 4 workers, 1 Gbit/s: ring-topk and topk-allgather
    "docs/results/ring-topk-hetero-30/results.json",  # 4 workers, 100 Mbit/s, slowdown 1,1,2,4
    "docs/results/auto-pick-1207-4/results.json",  # 2-4 workers, 1 Gbit/s and unshaped, 4 seeds
]
OWN_K = ("allgather", "sparse-rs", "gloo-allgather")


def factors(path: Path, min_share: float, names: tuple[str, ...] = OWN_K) -> list[tuple[str, str, int, float, float, float]]:
    """(setting, contender, seed, share, raw ratio, factor) of every qualifying run in one file
    (sent through `names` on at least `min_share` of its buckets)."""
    out = []
    for setting, contenders in json.loads(path.read_text()).items():
        dense = contenders.get("allreduce") or []
        for name, runs in contenders.items():
            for i, run in enumerate(runs):
                share = sparse_share(run, names) or 0.0
                if share < min_share or i >= len(dense) or not (run.get("time_to_accuracy_s") and
                                                               dense[i].get("time_to_accuracy_s")):
                    continue  # not sparse enough, no allreduce of its seed, or one of them missed the target
                r = dense[i]["steps"] / run["steps"]
                out.append((setting, name, seed_of(run, i), share, r, sparse_factor(r, share)))
    return out


def seed_of(run: dict, i: int) -> int:
    """A run's seed: its folder's suffix (run_matrix names it <contender>-r<seed>), else its index."""
    tail = Path(run.get("run_dir") or "").name.rsplit("-r", 1)[-1]
    return int(tail) if tail.isdigit() else i


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="*", help="run_matrix results.json files (default: the shipped value's sources)")
    ap.add_argument("--min-share", type=float, default=0.8, help="least share of buckets sent as every rank's own k")
    ap.add_argument("--exchanges", default=",".join(OWN_K), help="the exchanges counted as the sparse step's "
                    "(shared-index: its k common entries, for runs with exchange=shared-index)")
    ap.add_argument("--before", action="store_true", help="the sources of Exchange.progress's 0.88 (OLD_SOURCES)")
    args = ap.parse_args(argv)
    paths = [Path(p) for p in args.results] or [ROOT / s for s in (OLD_SOURCES if args.before else SOURCES)]
    rows = []
    for p in paths:
        if not p.is_file():
            print(f"sparse_progress: no results file {p}: give run_matrix results.json files", file=sys.stderr)
            return 2
        rows += [(p.parent.name, *r) for r in factors(p, args.min_share, tuple(args.exchanges.split(",")))]
    if not rows:
        print("sparse_progress: no run sent its own top k on enough buckets beside an allreduce run of its seed",
              file=sys.stderr)
        return 1
    t = Table("sitting", "setting", "contender", "seed", "own-k share", "allreduce / its steps", "factor")
    for src, setting, name, seed, share, r, f in rows:
        t.add_row(src, setting, name, str(seed), f"{share:.0%}", f"{r:.3f}", f"{f:.3f}")
    console = Console(width=140)
    console.print(t)
    fs = [r[-1] for r in rows]
    q = statistics.quantiles(fs, n=4) if len(fs) > 1 else [fs[0]] * 3
    console.print(f"progress of a sparse step ({args.exchanges}) against a dense one: median {statistics.median(fs):.3f} "
                  f"over {len(fs)} runs (quartiles {q[0]:.3f} / {q[2]:.3f}, range {min(fs):.3f}-{max(fs):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
