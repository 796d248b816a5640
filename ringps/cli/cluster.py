"""`ringps cluster up|status|down`: emulated hosts (network namespaces + tc) by hand.

Rate is the only thing shaped: this kernel has tbf and htb but no netem, so there is no delay or
loss emulation. `ringps train --net RATE` does all of this by itself for one run.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from ringps.config import host_rates
from ringps.errors import ConfigError

HELP = ("emulated hosts: network namespaces joined by a bridge, each link rate-shaped with tc "
        "(rate only: no netem here, so no delay or loss)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = sub.add_parser("up", help="create N hosts with shaped links; prints the id")
    up.add_argument("--hosts", type=int, default=4)
    up.add_argument("--bandwidth", default="1gbit", help="one rate for every link, or one per host (comma-separated)")
    sub.add_parser("status", help="list the ringps namespaces that exist")
    down = sub.add_parser("down", help="remove clusters (all of them, or --id ID)")
    down.add_argument("--id", default=None)


def run(args: argparse.Namespace) -> int:
    from ringps.launch import cluster as cl

    console = Console()
    if args.action == "up":
        if args.hosts < 1:
            raise ConfigError(f"--hosts {args.hosts}: must be >= 1")
        rates = host_rates(args.bandwidth, args.hosts)
        c = cl.Cluster.create(rates, keep=True)  # stays until `ringps cluster down`
        console.print(c.describe())
        for h in range(c.hosts):
            console.print(f"  host {h}: {c.addr(h)}  ip netns exec {c.ns(h)} COMMAND  (GLOO_SOCKET_IFNAME=eth0)")
        console.print(f"remove with: ringps cluster down --id {c.id}")
        return 0
    clusters = cl.known_clusters()
    if args.action == "status":
        if not clusters:
            console.print("no ringps clusters")
            return 0
        t = Table("id", "namespaces", "owner")
        for cid, names in sorted(clusters.items()):
            c = cl.load(cid)
            owner = "kept (cluster up)" if c.owner_pid == -1 else f"pid {c.owner_pid}"
            t.add_row(cid, ", ".join(sorted(names)), owner)
        console.print(t)
        return 0
    targets = [args.id] if args.id else list(clusters)
    if args.id and args.id not in clusters:
        raise ConfigError(f"--id {args.id}: no such cluster (see `ringps cluster status`)")
    for cid in targets:
        cl.load(cid).destroy()
        console.print(f"removed cluster {cid}")
    return 0
