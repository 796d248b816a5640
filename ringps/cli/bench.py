"""`ringps bench net|comm`: measurements of the transport itself.

    ringps bench net --hosts 4 --bandwidth 1gbit      # per-link TCP and all_reduce vs the shaped rate
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from ringps.config import parse_rate
from ringps.errors import ConfigError

HELP = "measure the network (bench net) or the exchanges (bench comm)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    net = sub.add_parser("net", help="per-link TCP bandwidth and all_reduce busbw on an emulated cluster")
    net.add_argument("--hosts", type=int, default=4)
    net.add_argument("--bandwidth", default="1gbit", help="one rate, or one per host (comma-separated)")
    net.add_argument("--seconds", type=float, default=1.0, help="about how long each transfer takes")
    net.add_argument("--iters", type=int, default=3, help="timed all_reduce repetitions (median)")


def _mbit(bps: float) -> str:
    return f"{bps / 1e6:,.1f} Mbit/s"


def run_net(args: argparse.Namespace) -> int:
    from ringps.launch.cluster import format_rate
    from ringps.launch.netbench import bench_net

    if args.hosts < 2:
        raise ConfigError(f"--hosts {args.hosts}: need at least 2 hosts to measure a link")
    try:
        rates = [parse_rate(r) for r in args.bandwidth.split(",")]
    except ValueError as e:
        raise ConfigError(f"--bandwidth {args.bandwidth}: {e}") from None
    rates = rates * args.hosts if len(rates) == 1 else rates
    if len(rates) != args.hosts:
        raise ConfigError(f"--bandwidth: {len(rates)} rates for --hosts {args.hosts}")
    res = bench_net(rates, args.seconds, args.iters)
    console = Console()
    console.print(res.description)
    t = Table("host", "configured", "TCP to next host", "ratio", "all_reduce send rate", "ratio")
    for link in res.links:
        t.add_row(str(link.host), format_rate(link.rate_bps), _mbit(link.tcp_bps), f"{link.tcp_bps / link.rate_bps:.2f}",
                  _mbit(link.allreduce_tx_bps), f"{link.allreduce_tx_bps / link.rate_bps:.2f}")
    console.print(t)
    console.print(
        f"all_reduce of {res.allreduce_bytes / 1e6:.1f} MB over {len(res.links)} hosts: median {res.allreduce_s:.3f}s, "
        f"algbw {_mbit(res.algbw_bps)}, busbw {_mbit(res.busbw_bps)} = {res.busbw_bps / res.rate_bps:.2f} x "
        f"{format_rate(res.rate_bps)}"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    return {"net": run_net}[args.what](args)
