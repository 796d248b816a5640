"""`ringps plan`: the layer-aware plan for a model on this machine, with the cost model's times.

    ringps plan --model facenet --workers 4 --net 1gbit

The layers are profiled here (one process, one batch); the compute is scaled by the contention
of the real job (its processes per CPU core) and the links are the --net rate (or --bandwidth).
"""

from __future__ import annotations

import argparse

from rich.table import Table

from ringps.cli.tables import wide_console
from ringps.config import parse_rate, validate
from ringps.errors import ConfigError

HELP = "print the layer-aware transmission plan (method, priority, partition, predicted times)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="facenet")
    p.add_argument("--dataset", default="orl-faces")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--net", default="1gbit", help="every link's rate (workers' and servers')")
    p.add_argument("--density", type=float, default=0.01, help="top-k density")
    p.add_argument("--threads", type=int, default=1)


def _ms(s: float) -> str:
    return f"{1e3 * s:.1f} ms"


def run(args: argparse.Namespace) -> int:
    import torch

    from ringps.cost import CostParams, calibrate_cpu, contention, cores
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
    cfg = validate({"dataset": args.dataset, "model": args.model, "batch_size": args.batch_size})
    torch.set_num_threads(args.threads)
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
