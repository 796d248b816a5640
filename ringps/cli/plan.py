"""`ringps plan`: the layer-aware plan for a model on this machine, with the cost model's times.

    ringps plan --model facenet --workers 4 --net 1gbit

The layers are profiled here (one process, one batch); the compute is scaled by the contention
of the real job (its processes per CPU core) and the links are the --net rate (or --bandwidth).

    ringps plan --auto --model facenet --workers 64 --net 10gbit [--compute-scale A]
    ringps plan --auto --workers 64 --net 25gbit --node-size 8 --intra-net 600gbit   # or --cluster FILE
    ringps plan --auto --here --workers 4 --net 1gbit [--calibration FILE]

`--auto` ranks every strategy and its key setting by predicted time-to-accuracy on the described
cluster (the flags and --cluster file of `ringps simulate`), the shipped profile's compute times
--compute-scale; `--here` prices this machine
instead, exactly as `ringps train --strategy auto` with the same flags does before it starts.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from ringps.cli.simulate import CLUSTER_FLAGS, CLUSTER_KEYS, add_cluster_arguments, describe
from ringps.cli.tables import wide_console
from ringps.config import parse_rate, validate
from ringps.errors import ConfigError
from ringps.malloc import keep_freed_memory

OWN_FLAGS = ("workers", "servers", "net", "slowdown")  # cluster keys plan defines itself (the layer plan uses them too)
HELP = "print the layer-aware transmission plan (method, priority, partition, predicted times)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="facenet")
    p.add_argument("--dataset", default="orl-faces")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, help="default 4 (--auto: the --cluster file's, else 4)")
    p.add_argument("--servers", type=int, help="default 1")
    p.add_argument("--net", help="every link's rate (workers' and servers'); default 1gbit, but with --auto --here "
                   "unshaped (loopback), as `ringps train` without --net runs")
    p.add_argument("--density", type=float, default=0.01, help="top-k density")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--auto", action="store_true", help="rank every strategy and its key setting by the simulator's "
                   "predicted time-to-accuracy, and recommend one")
    p.add_argument("--profile", help="--auto: workload profile (default: the model's shipped one)")
    p.add_argument("--slowdown", help="--auto: per-worker factors, e.g. 1,1,2,4")
    # --auto without --here describes the cluster as `ringps simulate` does: the same flags, or --cluster FILE
    add_cluster_arguments(p, skip=OWN_FLAGS)
    p.add_argument("--here", action="store_true", help="--auto: price this machine as `ringps train --strategy auto` "
                   "does: time the job's step here, every worker a process on these cores (--net loopback: unshaped)")
    p.add_argument("--calibration", help="--auto --here: price it with this calibration file instead "
                   "(ringps simulate --calibrate RUN... --out FILE)")
    p.add_argument("--auto-resolution", type=float, help="--auto: predictions within this fraction of the fastest are "
                   "ties, and the plainest update among them is recommended (`ringps train`'s flag; default 0.05; 0: the fastest)")
    p.add_argument("--sparse-progress", type=float, help="--auto: a sparse step's progress against a dense one for "
                   "ring-topk's exchanges (`ringps train`'s flag; default: each exchange's own)")


def _ms(s: float) -> str:
    return f"{1e3 * s:.1f} ms"


def run_auto(args: argparse.Namespace) -> int:
    from ringps.sim.auto import rank, reasons, seconds
    from ringps.sim.cluster import load_cluster
    from ringps.sim.predict import load_progress
    from ringps.sim.workload import load_workload

    if args.here:  # the choice `ringps train --strategy auto` makes with these flags
        from ringps.config import load_config
        from ringps.launch.run import auto_choices, measured_dict, measured_words

        job = {"model": args.model, "dataset": args.dataset, "batch_size": args.batch_size, "workers": args.workers,
               "servers": args.servers, "net": None if args.net in (None, "loopback") else args.net, "threads": args.threads,
               "slowdown": args.slowdown, "auto_calibration": args.calibration, "strategy": "auto",
               "sparse_progress": args.sparse_progress, "auto_resolution": args.auto_resolution}
        choices, c, measured, w, _ = auto_choices(load_config(None, {k: v for k, v in job.items() if v is not None}),
                                               "--calibration")
    else:
        w = load_workload(args.profile or args.model)
        c = load_cluster(args.cluster, {k: getattr(args, k) for k in CLUSTER_KEYS})
        from ringps.config import load_config
        from ringps.sim.engine import Options

        # train's bounds, their one-line errors
        own = load_config(None, {k: v for k, v in (("sparse_progress", args.sparse_progress),
                                                    ("auto_resolution", args.auto_resolution)) if v is not None})
        choices, measured = rank(w, c, load_progress(None), base=Options(sparse_progress=args.sparse_progress),
                                 resolution=own.strategy.auto_resolution), None
    t = Table("rank", "strategy (setting)", "time-to-accuracy", "step", "utilization", "MB/step", "staleness / drops")
    for i, ch in enumerate(choices):
        p = ch.prediction
        hist = p.extra.get("staleness_histogram")
        t.add_row(str(i + 1), ch.label(), seconds(ch.tta) if ch.tta != float("inf") else "-", f"{p.step_s:.3f} s",
                  f"{p.utilization:.0%}", f"{p.bytes_per_step / 1e6:.1f}",
                  f"mean {p.extra['mean_staleness']:.1f}, {p.extra['drop_fraction']:.1%} dropped" if hist else "")
    console = wide_console()
    loopback = args.here and args.net in (None, "loopback")  # unshaped: priced as a fast link
    console.print(f"{w.name} on {describe(c, f'loopback (priced as {c.net})' if loopback else '')}"
                  + (f"; this job's step measured here: {measured_words(measured_dict(measured), c.sync_wait_s)} "
                     f"(x{c.compute_scale:.2f} the profile per whole core), {c.shared_cores} shared cores" if measured else ""))
    console.print(t)
    console.print("recommended: " + reasons(choices))
    return 0


def run(args: argparse.Namespace) -> int:
    if (args.here or args.calibration) and not args.auto:
        raise ConfigError("--here and --calibration price `ringps plan --auto`'s ranking: add --auto")
    if args.calibration and not args.here:
        raise ConfigError("--calibration prices this machine: add --here (a described cluster takes --compute-scale)")
    described = [k for k in CLUSTER_FLAGS if k not in OWN_FLAGS and getattr(args, k) is not None]
    if described and (args.here or not args.auto):
        raise ConfigError(f"--{described[0].replace('_', '-')} describes a cluster for `ringps plan --auto` without "
                          "--here (--here prices this machine; the layer plan takes --workers, --servers and --net)")
    if args.auto and not args.here:
        return run_auto(args)  # unset flags: the --cluster file's keys, else the cluster's defaults
    args.workers = 4 if args.workers is None else args.workers
    args.servers = 1 if args.servers is None else args.servers
    if args.auto:
        return run_auto(args)
    args.net = args.net or "1gbit"
    import torch

    from ringps.comm.probe import calibrate_cpu
    from ringps.cost import CostParams, contention, cores
    from ringps.data import load_dataset
    from ringps.data.loader import ShardedLoader
    from ringps.models import build_model
    from ringps.schedule.plan import dense_plan, make_plan
    from ringps.schedule.profile import profile_model

    if args.workers < 1 or args.servers < 1:
        raise ConfigError("--workers and --servers: must be >= 1")
    try:
        bps = parse_rate(args.net) / 8 * 0.95
    except ValueError as e:
        raise ConfigError(f"--net {args.net}: {e}") from None
    cfg = validate({"dataset": args.dataset, "model": args.model, "batch_size": args.batch_size, "density": args.density})
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # as the workers whose compute this stands for
    data = load_dataset(cfg.data)
    torch.manual_seed(0)
    model = build_model(args.model, data.shape, data.num_classes)
    batch = next(iter(ShardedLoader(data.train, 0, 1, args.batch_size, 0).epoch(0)))
    prof = profile_model(model, batch.inputs, batch.targets)
    cost = CostParams(bandwidth=bps, latency=2e-4, **calibrate_cpu())
    factor = contention(args.workers + args.servers, args.threads)
    plan = make_plan(prof, args.workers, args.servers, bps, bps, cost, args.density, contention=factor)
    off = dense_plan(prof, args.workers, args.servers, bps, bps, cost, contention=factor)
    console = wide_console()
    console.print(f"{args.model} on {args.dataset}, batch {args.batch_size} per worker, {args.workers} workers, "
                  f"{args.servers} server(s), links {args.net}; compute x{factor:.1f} for "
                  f"{args.workers + args.servers} processes on {cores()} cores")
    t = Table("priority", "layer", "kind", "params", "fwd", "bwd", "method", "server", "up / step",
              "down / step", "link time", "cpu ms push/reply/server")
    for l in plan.layers:
        link = max(args.workers * max(l.up_bytes, l.down_bytes) / bps, (l.up_bytes + l.down_bytes) / bps)
        t.add_row(str(l.priority), l.name, l.kind, f"{l.params:,}", _ms(l.forward_s),
                  _ms(l.backward_s), l.method, str(l.server),
                  f"{l.up_bytes / 1e6:.2f} MB", f"{l.down_bytes / 1e6:.2f} MB", _ms(link),
                  f"{l.cpu_s * 1e3:.0f}/{l.replay_s * 1e3:.0f}/{l.server_s * 1e3:.0f}")
    console.print(t)
    for label, p in (("auto (this plan)", plan), ("off (all dense, after the backward)", off)):
        pr = p.predict()
        console.print(f"predicted step, {label}: {pr['step_s']:.2f} s  (compute {pr['compute_s']:.2f} s + exposed "
                      f"{pr['exposed_s']:.2f} s; bounds: own link {pr['own_link_s']:.2f} s, server link "
                      f"{pr['server_link_s']:.2f} s, server cpu {pr['server_cpu_s']:.2f} s)")
    return 0
