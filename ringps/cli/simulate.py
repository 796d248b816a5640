"""`ringps simulate`: predict every strategy on a cluster you describe, from a workload profile.

    ringps simulate --profile facenet --workers 64 --net 10gbit --strategy allreduce,ring-topk,ps-threshold
    ringps simulate --profile resnet50-k80 --cluster my-cluster.yaml --strategy all --json
    ringps simulate --calibrate runs/a runs/b --out calibration.yaml
    ringps simulate --calibrate runs/ps-* --duplex server-link/results.json --out calibration.yaml

Per strategy: step time, utilization, exposed communication and bytes per step, for parameter
servers the staleness histogram, drop fraction and server-link occupancy, and time-to-accuracy
from the progress model (ringps/sim/predict.py; `--progress FILE` for your own measurements).
Cluster keys are flags and YAML keys alike: workers, net, latency_s, node_size, intra_net,
slowdown, jitter, servers, server_net, efficiency, fairness, server_efficiency, server_duplex,
compute_scale, forward_share, optimizer_share, shared_cores, cpu_per_byte, sync_wait_s.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.table import Table

from ringps.cli.tables import wide_console
from ringps.errors import ConfigError

HELP = "predict step time and time-to-accuracy of every strategy on a cluster (discrete events + alpha-beta)"
# the cluster YAML's keys (sim/cluster.py) as flags, and --cluster for the file itself
CLUSTER_FLAGS: dict[str, dict] = {
    "cluster": dict(help="cluster YAML (flags override its keys)"),
    "workers": dict(type=int),
    "net": dict(help="each host's link rate, e.g. 10gbit"),
    "latency_s": dict(type=float),
    "node_size": dict(type=int, help="workers per node (with --intra-net)"),
    "intra_net": dict(help="link rate inside a node"),
    "slowdown": dict(help="per-worker factors, e.g. 1,1,2,4 (repeated over the workers)"),
    "jitter": dict(type=float, help="lognormal sigma of each step's compute"),
    "servers": dict(type=int),
    "server_net": dict(),
    "efficiency": dict(type=float, help="payload per configured link bit (calibrated: --calibrate)"),
    "fairness": dict(type=float, help="how transfers in flight share a server's link: 1 evenly (default), "
                     "0 first come first served (a drop-tail queue that overflows)"),
    "server_efficiency": dict(type=float, help="the servers' links' payload per bit (default: --efficiency)"),
    "server_duplex": dict(type=float, help="each direction of a server's link while pushes come in and replies "
                          "go out at once, x its rate (default 1: independent; benchmarks/server_link.py measures it)"),
    "compute_scale": dict(type=float, help="the profile's compute x this (another device)"),
    "forward_share": dict(type=float, help="the forward's share of a worker's compute per step (default: the "
                          "profile's; --calibrate fits it from the runs' traces)"),
    "optimizer_share": dict(type=float, help="the optimizer step's share of a worker's compute per step, after "
                            "the exchange (default: the profile's optimizer_s; --calibrate fits it)"),
    "shared_cores": dict(type=int, help="all workers are processes sharing this many cores (an emulated cluster "
                         "on one machine, like ringps's own --net runs)"),
    "cpu_per_byte": dict(type=float, help="CPU seconds per byte a worker sends or receives, on the cores it "
                         "computes on (default 0: not modelled; --calibrate reports the host kernel's)"),
    "sync_wait_s": dict(type=float, help="seconds per synchronous step the workers wait to line up beyond the "
                        "model's (default 0; --strategy auto measures it: its DDP step on loopback less the model's)"),
}
CLUSTER_KEYS = tuple(k for k in CLUSTER_FLAGS if k != "cluster")


def describe(c, links: str = "") -> str:
    """The cluster in a few words, for a table's heading (`links`: how its links are priced)."""
    return (f"{c.workers} workers, {links or c.net + ' links'}"
            + (f", nodes of {c.node_size} ({c.intra_net or c.net} inside)" if c.node_size > 1 else "")
            + (f", slowdown {c.slowdown}" if c.slowdown else "") + (f", jitter {c.jitter}" if c.jitter else ""))


def add_cluster_arguments(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The cluster's flags, one per key of the cluster YAML (sim/cluster.py), less `skip` (those a
    command defines its own way): `ringps simulate` and `ringps plan --auto` describe it alike."""
    for key, kw in CLUSTER_FLAGS.items():
        if key not in skip:
            p.add_argument("--" + key.replace("_", "-"), **kw)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="facenet", help="workload profile: a YAML file or a shipped name")
    add_cluster_arguments(p)
    p.add_argument("--strategy", default="all", help="comma-separated, or all")
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--local-period", type=int, default=8)
    p.add_argument("--staleness-threshold", type=int)
    p.add_argument("--powersgd-start-iter", type=int, default=10, help="PowerSGD's plain all-reduce steps first")
    p.add_argument("--local-warmup-steps", type=int, default=20, help="localsgd's global all-reduce steps first")
    p.add_argument("--density-warmup-epochs", type=float, default=2.0, help="ring-topk's density ramp (epochs)")
    p.add_argument("--sparse-progress", type=float, help="ring-topk: a sparse step's progress against a dense one, for "
                   "every sparse exchange (default: each exchange's own; `ringps train`'s flag of the same name)")
    p.add_argument("--run-steps", type=int, help="the run's length in steps: where ring-topk's exact tail begins "
                   "(default: not given, no tail)")
    p.add_argument("--exact-tail", type=float, default=0.4, help="ring-topk: the run's last fraction of steps that go by "
                   "the most faithful exchanges (as `ringps train --exact-tail`)")
    p.add_argument("--steps", type=int, default=30, help="steps (pushes per worker) simulated")
    p.add_argument("--progress", help="progress model YAML (default: the one calibrated here)")
    p.add_argument("--trace", metavar="DIR", help="write the predicted timelines (trace/sim-rank-R.json) there")
    p.add_argument("--json", action="store_true", help="one JSON object per strategy, for scripts")
    p.add_argument("--calibrate", nargs="+", metavar="RUN", help="fit link efficiency, CPU and progress from run folders")
    p.add_argument("--out", help="--calibrate: where to write the fitted progress model (YAML)")
    p.add_argument("--duplex", nargs="+", metavar="JSON", help="--calibrate: benchmarks/server_link.py results of the "
                   "servers' links (each direction while pushes and replies cross at once), taken as measured and "
                   "written to the file; without it a server's two directions are independent")


def options(args: argparse.Namespace):
    from ringps.config import load_config
    from ringps.sim.engine import Options

    if args.steps < 1:
        raise ConfigError(f"--steps {args.steps}: steps (pushes per worker) to simulate, at least 1")
    # the strategy settings mean what `ringps train`'s do: its config's bounds, its one-line errors
    load_config(None, {k: getattr(args, k) for k in ("density", "powersgd_rank", "local_period", "staleness_threshold",
                                                     "powersgd_start_iter", "local_warmup_steps", "density_warmup_epochs",
                                                     "sparse_progress")
                       if getattr(args, k) is not None})
    if args.run_steps is not None and args.run_steps < 1:
        raise ConfigError(f"--run-steps {args.run_steps}: the run's length, at least 1 step")
    if not 0.0 <= args.exact_tail < 1.0:
        raise ConfigError(f"--exact-tail {args.exact_tail}: a fraction of the run's steps, in [0, 1)")
    return Options(density=args.density, powersgd_rank=args.powersgd_rank, local_period=args.local_period,
                   staleness_threshold=args.staleness_threshold, powersgd_start_iter=args.powersgd_start_iter,
                   local_warmup_steps=args.local_warmup_steps, density_warmup_epochs=args.density_warmup_epochs,
                   total_steps=args.run_steps, exact_tail=args.exact_tail, sparse_progress=args.sparse_progress)


def strategies(spec: str) -> list[str]:
    from ringps.sim.engine import STRATEGIES

    names = list(STRATEGIES) if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in names if s not in STRATEGIES]
    if bad:
        raise ConfigError(f"--strategy {bad[0]}: the simulator knows {', '.join(STRATEGIES)}")
    return names


def run(args: argparse.Namespace) -> int:
    from ringps.sim.auto import seconds
    from ringps.sim.cluster import load_cluster
    from ringps.sim.predict import dense_steps_at, load_progress, noise_scale, simulate
    from ringps.sim.workload import load_workload

    if args.calibrate:
        from ringps.sim.calibrate import calibrate

        return calibrate([Path(r) for r in args.calibrate], args.out, wide_console(),
                         [Path(p) for p in args.duplex] if args.duplex else None)
    if args.duplex:
        raise ConfigError("--duplex: measured server links for --calibrate (a prediction takes --server-duplex)")
    w = load_workload(args.profile)
    c = load_cluster(args.cluster, {k: getattr(args, k) for k in CLUSTER_KEYS})
    prog, o = load_progress(args.progress), options(args)
    preds = [simulate(s, w, c, o, prog, steps=args.steps, trace_dir=Path(args.trace) / s if args.trace else None)
             for s in strategies(args.strategy)]
    if args.json:
        for p in preds:
            print(json.dumps(p.as_dict()))
        return 0
    console = wide_console()
    k = w.kernels
    own = ("the strategies' own work at this host's costs" if k is None else
           f"the strategies' own work at {k.memory_gb_s:g} GB/s, {k.fp32_tflops:g} TFLOPS" if k.memory_gb_s and k.fp32_tflops
           else "the strategies' own work at the profile's kernels")
    console.print(f"{w.name} ({w.params / 1e6:.1f} M parameters, {w.compute_s * 1e3:.0f} ms per step on {w.device or '?'}; "
                  f"{own}) on {describe(c)}")
    t = Table("strategy", "step", "utilization", "exposed/step", "MB/step", "time-to-accuracy", "staleness (ps)", "drops",
              "server link")
    for p in sorted(preds, key=lambda p: p.extra.get("time_to_accuracy_s") or float("inf")):
        tta = p.extra.get("time_to_accuracy_s")
        hist = p.extra.get("staleness_histogram")
        t.add_row(p.strategy, f"{p.step_s * 1e3:.1f} ms", f"{p.utilization:.0%}", f"{p.exposed_s * 1e3:.1f} ms",
                  f"{p.bytes_per_step / 1e6:.2f}" + (f" (tail {p.extra['tail']['bytes_per_step'] / 1e6:.2f})"
                                                     if "tail" in p.extra else ""), seconds(tta) if tta else "-",
                  f"mean {p.extra['mean_staleness']:.1f}, max {max(hist)}" if hist else "",
                  f"{p.extra['drop_fraction']:.1%}" if hist else "", f"{p.extra['server_link_occupancy']:.0%}" if hist else "")
    console.print(t)
    noise, dense = noise_scale(w, prog), dense_steps_at(c.workers, w, prog)
    if dense is None:  # a profile of the user's own model: nothing says how many steps it needs
        console.print(f"time-to-accuracy: not predicted, {w.name} has no steps to its target: add steps_to_target "
                      f"(dense steps at {prog.workers_ref} workers) to the profile (`ringps profile --steps-to-target N`), or give --progress FILE from `ringps simulate "
                      "--calibrate RUN...` of your own runs")
        return 0
    console.print(f"time-to-accuracy: {prog.source or 'progress model'}; steps to target from "
                  f"{'the progress file' if prog.dense_steps else 'the profile'}: {dense:.3g} "
                  f"dense steps at {c.workers} workers (" + (f"gradient noise scale {noise:g} samples" if noise is not None
                                                            else "constant samples to the target") + ")")
    return 0
