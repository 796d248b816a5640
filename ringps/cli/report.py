"""`ringps report RUN...`: the side-by-side table for finished runs, and PNG plots
(accuracy and loss against wall time, time breakdown per worker)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from ringps.cli.plots import plot_runs
from ringps.cli.tables import print_summaries, wide_console
from ringps.errors import ConfigError

HELP = "summarise finished runs side by side and plot their curves"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders (each with summary.json)")
    p.add_argument("--plots", metavar="DIR", help="where to write the PNGs (default: the first run's parent)")
    p.add_argument("--breakdown", action="store_true",
                   help="per rank: shares of compute, exposed communication, evaluation and idle, from the traces")


def print_breakdowns(runs: list, console: Console) -> None:
    from rich.table import Table

    from ringps.cli.timeline import breakdown

    for d, _ in runs:
        b = breakdown(d)
        if not b:
            console.print(f"{d}: no traces (run with --trace)")
            continue
        t = Table("rank", "role", "wall s", "compute", "exposed comm", "evaluation", "idle", "server: applying",
                  title=f"{d.name}: where each rank's time went (from trace/)", title_justify="left")
        pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
        for rank, r in sorted(b.items()):
            if r["role"] == "server":
                t.add_row(str(rank), "server", f"{r['wall_s']:.1f}", "", "", "", "", pct(r["apply_share"]))
            else:
                t.add_row(str(rank), "worker", f"{r['wall_s']:.1f}", pct(r["compute_share"]), pct(r["comm_share"]),
                          pct(r["eval_share"]), pct(r["idle_share"]), "")
        console.print(t)


def run(args: argparse.Namespace) -> int:
    from ringps.train.summary import finalize, load_summary

    runs = []
    for r in args.runs:
        d = Path(r)
        if (d / "summary.json").is_file():
            runs.append((d, load_summary(d)))
        elif (d / "config.yaml").is_file() and (d / "ranks").is_dir():
            runs.append((d, finalize(d)))  # an interrupted run: summarise what it recorded
        else:
            raise ConfigError(f"{r}: not a run folder (no summary.json or ranks/)")
    console = wide_console()
    if args.breakdown:
        print_breakdowns(runs, console)
    print_summaries([s for _, s in runs], console, title="runs (ratios to the first)")
    out = Path(args.plots) if args.plots else runs[0][0].parent
    written = plot_runs(runs, out)
    console.print("plots: " + ", ".join(str(p) for p in written))
    return 0
