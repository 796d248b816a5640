"""`ringps list`: what is registered (strategies, exchanges, server policies, models, datasets)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

HELP = "list the registered strategies, exchanges, server policies, models and datasets"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from ringps.comm.exchanges import EXCHANGES
    from ringps.data import DATASETS
    from ringps.models import MODELS
    from ringps.ps import POLICIES
    from ringps.strategies import STRATEGIES

    t = Table("kind", "names")
    t.add_row("strategy", ", ".join(STRATEGIES.names()) + ", auto (the simulator's pick)")
    t.add_row("exchange", ", ".join(n + ("" if EXCHANGES.get(n).auto else " (not weighed by auto)") for n in EXCHANGES.names())
              + ", auto (ring-topk --exchange: per bucket, the shortest step per unit of progress)")
    t.add_row("server policy", ", ".join(POLICIES.names()) + " (strategy ps-NAME)")
    notes = {n: POLICIES.get(n).memory_note for n in POLICIES.names() if POLICIES.get(n).memory_note}
    t.add_row("server memory", "every policy: values, momentum, 4 receive buffers and 4 reply snapshots of the shard; "
              + "; ".join(f"ps-{n} also: {v}" for n, v in notes.items()))
    t.add_row("model", ", ".join(MODELS.names()))
    t.add_row("dataset", ", ".join(n if n != "folder" else "folder:PATH" for n in DATASETS.names()))
    Console().print(t)
    return 0
