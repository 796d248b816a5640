"""`ringps train`: one job. Locally it starts the ranks itself; under torchrun it is one rank.

    ringps train                                   # the demo: facenet on orl-faces, 4 local workers
    ringps train --strategy powersgd --epochs 5 --workers 2
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr HOST0 --master-port 29500 \\
        -m ringps train --strategy allreduce       # the same on each node, with its --node-rank
"""

from __future__ import annotations

import argparse

from rich.console import Console

from ringps.cli.options import add_config_flags, config_overrides
from ringps.cli.tables import print_summaries, wide_console
from ringps.config import load_config

HELP = "train a model with one strategy (local workers, or one rank under torchrun)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_flags(p)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, config_overrides(args))
    from ringps.launch.run import check, run_job, under_torchrun

    if under_torchrun():
        from ringps.launch.worker import run_process

        if cfg.strategy.strategy != "auto":  # auto is checked once the ranks have chosen (launch/auto_group.py)
            check(cfg)
        return run_process(cfg, None, managed=False)
    console = wide_console()
    summary = run_job(cfg, Console(stderr=True))
    print_summaries([summary], console)
    console.print(f"run folder: {summary['run_dir']}")
    return 0
