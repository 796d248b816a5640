"""One training job from a validated config to a finished run folder (what `ringps train` does).

    summary = run_job(cfg)        # creates runs/NAME, starts the ranks, watches them, summarises
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Iterator, Optional

from rich.console import Console

from ringps.comm.exchanges import EXCHANGES
from ringps.compress import MEMORIES, SELECTORS
from ringps.config import Config
from ringps.data import load_dataset
from ringps.errors import ConfigError
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
    for flag, value, registry in (("--selector", cfg.compress.selector, SELECTORS), ("--memory", cfg.compress.memory, MEMORIES),
                                  ("--exchange", cfg.compress.exchange, EXCHANGES)):
        if value != "auto" and value not in registry:
            raise ConfigError(f"{flag} {value}: {registry.unknown(value)}")
    strategy.check(cfg)
    if cfg.train.resume is not None and not Path(cfg.train.resume).is_dir():
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


def auto_choices(cfg: Config, flag: str = "--auto-calibration", links: Optional[tuple[float, float]] = None,
                 nodes: int = 1, gpu: bool = False) -> tuple[list, Any, Optional[Any], Any, Optional[Any]]:
    """Every candidate strategy for this job, fastest predicted first (ringps/sim/auto.py), with
    the cluster it priced, the step it measured here (None: a calibration file priced it), the
    workload profile and the selection's per-element costs measured here (None: none measured);
    `flag`: the calibration file's flag, for its errors. Locally the cluster is this machine's
    emulated one; under torchrun (`links`: the group's measured latency and bandwidth,
    launch/auto_group.py) `nodes` hosts of this one's kind (`gpu`: a device per rank)."""
    from ringps.cost import contention, cores
    from ringps.data.loader import steps_per_epoch
    from ringps.launch.measure import measure_step
    from ringps.sim.auto import rank, sync_wait
    from ringps.sim.calibrate import Fitted, emulated_cluster, fitted_from
    from ringps.sim.engine import Options
    from ringps.sim.predict import load_calibration
    from ringps.sim.workload import load_workload

    prog = load_calibration(cfg.strategy.auto_calibration, flag)
    w = load_workload(cfg.model.model)
    servers, net = cfg.run.servers, cfg.run.net.split(",")[0] if cfg.run.net else None
    fitted, measured = fitted_from(prog), None
    if fitted is None:  # no calibration of this machine: the job's own step, timed here, prices the profile
        # by as many processes at once as will share a host's cores (at most twice the cores'
        # count), per whole core as the cluster's shared cores take it
        local = 1 if gpu else min(-(-cfg.run.workers // nodes), 2 * cores())
        measured = m = measure_step(cfg, processes=local)
        per_core = 1.0 / contention(local) / w.compute_s  # the simulator shares cores among processes
        # a synchronous worker's compute is its compute in DDP where the processes took it (None: one
        # process), as calibration fits it from runs, and split as there (the profile's own split
        # leaves the optimizer out: more backward to hide behind); a parameter-server worker's, outside DDP
        ddp = m.sync_compute_s
        fitted = Fitted((ddp or m.step_s) * per_core, efficiency=prog.efficiency or 0.95, ps_compute_a=m.compute_s * per_core,
                        forward_share=m.sync_forward_s / ddp if ddp else None,
                        optimizer_share=m.sync_optimizer_s / ddp if ddp else None)
        if m.sync_step_s:  # the DDP step's lining up that the model does not show (sim/auto.py)
            loopback = emulated_cluster(local, None, None, 1, fitted)
            fitted = replace(fitted, sync_wait_s=sync_wait(m.sync_step_s, loopback, w, prog))
    if links is None:  # every process of the job on this machine's cores, as calibration models the runs
        c = emulated_cluster(cfg.run.workers, net, cfg.run.slowdown, servers, fitted)
        ps_c = emulated_cluster(cfg.run.workers, net, cfg.run.slowdown, servers, fitted, ps=True)
    else:
        from ringps.launch.auto_group import group_cluster

        c = group_cluster(cfg, links, nodes, gpu, fitted)
        ps_c = group_cluster(cfg, links, nodes, gpu, fitted, ps=True)
    # the run's length, where ring-topk's exact tail begins (as the trainer counts its steps)
    per_epoch = steps_per_epoch(w.samples, cfg.run.workers, cfg.data.batch_size) if w.samples else None
    total = cfg.train.steps or (cfg.train.epochs * per_epoch if per_epoch else None)
    # ring-topk's hook chooses its exchanges with the compute its profile measures in the workers
    # (the step outside DDP, as measured here: 0.29-0.30 s against 0.31 s at 4 processes on 2
    # cores), not the synchronous worker's compute in DDP the step is priced with (0.41 s)
    base = Options(total_steps=total, exact_tail=cfg.compress.exact_tail, sparse_progress=cfg.compress.sparse_progress,
                   plan_compute_s=measured.compute_s if measured else None)
    sel = selection_costs(gpu, cfg.run.threads)
    # a parameter server's ranks talk gloo, on CPU buffers: not beside NCCL
    return (rank(w, c, prog, base=base, ps_cluster=ps_c, with_ps=not gpu, selection_cpu=sel,
                 resolution=cfg.strategy.auto_resolution), c, measured, w, sel)


def selection_costs(gpu: bool, threads: int = 1) -> Optional[Any]:
    """The per-element costs ring-topk's hook measures at its start and prices its exchanges with
    (`comm.probe.calibrate_cpu`: selection, scatter-adds, passes), measured the same way here, on
    the device the job computes on, with the workers' intra-op `threads` (`--threads`, 1 by
    default: the launcher's torch has a thread per core, and timed so its passes and selection
    cost half what the hooks' do; docs/RESULTS.md §6). The validation grid
    predicted ring-topk's steps with its runs' recorded ones (within -9..+3%); CostParams's
    defaults, which priced auto before, charged a sparse step at 2 workers ~50 ms of selection the
    runs did not spend. None on a GPU job planned where there is no GPU (the profile's kernels
    price it)."""
    import torch

    from ringps.comm.probe import calibrate_cpu
    from ringps.cost import CostParams

    if gpu and not torch.cuda.is_available():
        return None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return CostParams(**calibrate_cpu(device=torch.device("cuda", torch.cuda.current_device()) if gpu else None))
    finally:
        torch.set_num_threads(before)


def auto_plan(cfg: Config, choices: list, c: Any, measured: Optional[Any], w: Any,
              sel: Optional[Any] = None) -> tuple[Config, dict[str, Any]]:
    """The ranking's pick as the job's new config, and the plan that chose it (auto-plan.json)."""
    from ringps.config import validate
    from ringps.sim.auto import reasons

    best = choices[0]
    flat = {k: v for sec in cfg.model_dump().values() for k, v in sec.items()}
    flat.update(strategy=best.strategy, **{k: v for k, v in best.settings.items() if v is not None})
    plan = {"chosen": best.label(), "reasons": reasons(choices), "cluster": c.model_dump(),
            "measured_step": None if measured is None else {**measured_dict(measured), "profile_compute_s": w.compute_s},
            "selection_costs": None if sel is None else {k: v for k, v in sel.as_dict().items() if k.endswith("_s")},
            "ranking": [{"strategy": ch.label(), "time_to_accuracy_s": ch.prediction.extra.get("time_to_accuracy_s"),
                         "step_s": ch.prediction.step_s} for ch in choices]}
    return validate(flat), plan


def resolve_auto(cfg: Config) -> tuple[Config, Optional[dict[str, Any]]]:
    """--strategy auto: the simulator's pick for this job, as a new config, and the ranking that
    chose it (written to the run folder as auto-plan.json)."""
    if cfg.strategy.strategy != "auto":
        return cfg, None
    return auto_plan(cfg, *auto_choices(cfg))


def measured_dict(m: Any) -> dict[str, Any]:
    """A StepCost as auto-plan.json records it: its fields and the whole step."""
    return {**asdict(m), "step_s": m.step_s}


def measured_words(m: dict[str, Any], wait: float = 0.0) -> str:
    """The step auto measured (auto-plan.json's measured_step), as the banners say it; `wait`: the
    synchronous steps' lining up it priced from it (the cluster's sync_wait_s)."""
    ddp = (f"; in DDP among them on loopback {m['sync_compute_s']:.3f} s of compute in a {m['sync_step_s']:.3f} s step"
           + (f", {wait:.3f} s beyond the model's, charged to every synchronous step" if wait else "")
           if m.get("sync_compute_s") else "")
    return f"{m['step_s']:.3f} s, {m['steps']} steps of {m['processes']} process(es) at once{ddp}"


def write_plan(run_dir: Path, plan: dict[str, Any], cfg: Config, console: Optional[Console] = None) -> None:
    """auto-plan.json in the run folder, and the choice on the console (stderr by default)."""
    import json

    (run_dir / "auto-plan.json").write_text(json.dumps(plan, indent=1))
    m = plan["measured_step"]
    wait = plan["cluster"].get("sync_wait_s", 0.0)
    priced = f" (priced on this job's step as measured here: {measured_words(m, wait)})" if m else f" (priced by {cfg.strategy.auto_calibration})"
    (console or Console(stderr=True)).print(f"--strategy auto chose {plan['reasons']}{priced}")


def run_job(cfg: Config, console: Optional[Console] = None, title: Optional[str] = None) -> dict[str, Any]:
    cfg, auto_plan = resolve_auto(cfg)
    check(cfg)
    run_dir = create_run_dir(cfg)
    console = console or Console(stderr=True)
    if auto_plan is not None:
        write_plan(run_dir, auto_plan, cfg, console)
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
