"""`ringps compare --strategies a,b,c [train options]`: the strategies one after another under
identical settings, each into RUN/<strategy>, then one side-by-side table with ratios to the first
strategy, and the plots of `ringps report`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from ringps.cli.options import add_config_flags, config_overrides
from ringps.cli.plots import plot_runs
from ringps.cli.tables import print_summaries, wide_console
from ringps.config import load_config
from ringps.errors import ConfigError

HELP = "run several strategies under identical settings and compare them side by side"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strategies", required=True, help="comma-separated strategy names; ratios are to the first")
    add_config_flags(p)


def run(args: argparse.Namespace) -> int:
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not names:
        raise ConfigError("--strategies: give at least one strategy name")
    over = config_overrides(args, exclude=("name", "out", "strategy"))
    base = Path(args.out) if getattr(args, "out", None) else Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    from ringps.launch.run import check, run_job
    from ringps.strategies import STRATEGIES

    cfgs = []
    for name in names:  # validate every run before the first one starts
        STRATEGIES.get(name)
        cfgs.append(load_config(args.config, {**over, "strategy": name, "name": name, "out": str(base / name)}))
    check(cfgs[0])
    console, err = wide_console(), Console(stderr=True)
    summaries = []
    for i, cfg in enumerate(cfgs):
        summaries.append(run_job(cfg, err, title=f"[{i + 1}/{len(cfgs)}] {cfg.strategy.strategy}"))
    print_summaries(summaries, console, title="side by side (ratios to the first strategy)")
    plots = plot_runs([(Path(s["run_dir"]), s) for s in summaries], base)
    console.print(f"runs and plots: {base}/ ({', '.join(p.name for p in plots)})")
    return 0
