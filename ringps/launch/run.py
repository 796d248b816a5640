"""One training job from a validated config to a finished run folder (what `ringps train` does).

    summary = run_job(cfg)        # creates runs/NAME, starts the ranks, watches them, summarises
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Optional

from rich.console import Console

from ringps.config import Config
from ringps.data import load_dataset
from ringps.launch.local import Job, Placement
from ringps.launch.progress import ProgressView
from ringps.launch.rundir import create_run_dir
from ringps.models import MODELS
from ringps.strategies import STRATEGIES
from ringps.train.summary import finalize


def check(cfg: Config) -> None:
    """Everything that can be checked before a process starts: names and the data."""
    strategy = STRATEGIES.get(cfg.strategy.strategy)
    MODELS.get(cfg.model.model)
    strategy.check(cfg)
    if cfg.train.resume is not None and not Path(cfg.train.resume).is_dir():
        from ringps.errors import ConfigError

        raise ConfigError(f"--resume {cfg.train.resume}: no such checkpoint folder (give runs/NAME/checkpoints/stepN, "
                          "or a parameter-server run's folder)")
    if cfg.run.net is not None:
        from ringps.launch.cluster import ClusterError, requirements_missing

        why = requirements_missing()
        if why:
            raise ClusterError(why)
        hosts = cfg.run.workers + (cfg.run.servers if strategy.needs_servers else 0)
        if len(cfg.run.net.split(",")) not in (1, hosts):
            raise ClusterError(f"--net {cfg.run.net}: {len(cfg.run.net.split(','))} rates for {hosts} hosts "
                               "(workers, then servers); give one rate, or one per host")
    data = load_dataset(cfg.data)
    if len(data.train.labels) < cfg.run.workers:
        from ringps.errors import ConfigError

        raise ConfigError(f"--workers {cfg.run.workers}: more workers than the {len(data.train.labels)} training samples")


@contextlib.contextmanager
def placement(cfg: Config, run_id: str) -> Iterator[Placement]:
    """Loopback, or an emulated cluster for --net that is removed again whatever happens."""
    if cfg.run.net is None:
        yield Placement()
        return
    from ringps.launch.cluster import cluster_placement

    with cluster_placement(cfg, run_id) as p:
        yield p


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "RINGPS_LAUNCHED" not in os.environ


def run_job(cfg: Config, console: Optional[Console] = None, title: Optional[str] = None) -> dict[str, Any]:
    check(cfg)
    run_dir = create_run_dir(cfg)
    console = console or Console(stderr=True)
    with placement(cfg, run_dir.name) as where:
        job = Job(cfg, run_dir, where)
        job.start()
        with ProgressView(run_dir, title or cfg.strategy.strategy, console, cfg.run.progress) as view:
            result = job.wait(view)
        # what each emulated host's interface really carried, read before the cluster goes
        counters = where.counters() if where.counters else None
    extra = {
        "synchronous": job.strategy_cls.synchronous,
        "launcher": "local",
        "placement": where.description,
        "job_s": result.job_s,
        "failed_workers": {str(r): why for r, why in result.failed.items()},
        "run_dir": str(run_dir),
        "host_bytes": counters,
    }
    return finalize(run_dir, extra)


def run_dir_of(summary: dict[str, Any]) -> Path:
    return Path(summary["run_dir"])
