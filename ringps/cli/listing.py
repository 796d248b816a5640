"""`ringps list`: what is registered (strategies, models, datasets)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

HELP = "list the registered strategies, models and datasets"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from ringps.data import DATASETS
    from ringps.models import MODELS
    from ringps.strategies import STRATEGIES

    t = Table("kind", "names")
    t.add_row("strategy", ", ".join(STRATEGIES.names()))
    t.add_row("model", ", ".join(MODELS.names()))
    t.add_row("dataset", ", ".join(n if n != "folder" else "folder:PATH" for n in DATASETS.names()))
    Console().print(t)
    return 0
