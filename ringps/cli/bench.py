"""`ringps bench net|comm`: measurements of the transport itself.

    ringps bench net --hosts 4 --bandwidth 1gbit      # per-link TCP and all_reduce vs the shaped rate
"""

from __future__ import annotations

import argparse

from rich.table import Table

from ringps.cli.tables import wide_console
from ringps.config import host_rates, parse_rate
from ringps.errors import ConfigError

HELP = "measure the network (bench net) or the exchanges (bench comm)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    net = sub.add_parser("net", help="per-link TCP bandwidth and all_reduce busbw on an emulated cluster")
    net.add_argument("--hosts", type=int, default=4)
    net.add_argument("--bandwidth", default="1gbit", help="one rate, or one per host (comma-separated)")
    net.add_argument("--seconds", type=float, default=1.0, help="about how long each transfer takes")
    net.add_argument("--iters", type=int, default=3, help="timed all_reduce repetitions (median)")
    comm = sub.add_parser("comm", help="time, bytes, algbw and busbw of every exchange, against the bound for its bytes")
    comm.add_argument("--workers", type=int, default=4)
    comm.add_argument("--net", default=None, help="shape each worker's link (e.g. 100mbit); default loopback")
    comm.add_argument("--sizes", default="1e6,1e7", help="tensor sizes in floats")
    comm.add_argument("--densities", default="0.01,0.001")
    comm.add_argument("--repeats", type=int, default=5)
    comm.add_argument("--block", type=int, default=256, help="shared-index block size")
    ps = sub.add_parser("ps", help="parameter-server throughput: pushes/s with W workers, and whether a slow "
                                   "worker's transfers hold the others up")
    ps.add_argument("--params", type=float, default=1e6, help="parameters on the server")
    ps.add_argument("--workers", type=int, default=3)
    ps.add_argument("--seconds", type=float, default=5.0)
    ps.add_argument("--policy", default="async", help="server policy (vsgd: pushes carry the value sample)")
    ps.add_argument("--slow-link", default=None, metavar="RATE",
                    help="also run with worker 0 behind a RATE link (others and the server at 10gbit) and compare")


def _mbit(bps: float) -> str:
    return f"{bps / 1e6:,.1f} Mbit/s"


def run_net(args: argparse.Namespace) -> int:
    from ringps.bench.net import bench_net
    from ringps.launch.cluster import format_rate

    if args.hosts < 2:
        raise ConfigError(f"--hosts {args.hosts}: need at least 2 hosts to measure a link")
    rates = host_rates(args.bandwidth, args.hosts)
    res = bench_net(rates, args.seconds, args.iters)
    console = wide_console()
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


def run_comm(args: argparse.Namespace) -> int:
    """nccl-tests definitions: algbw = tensor bytes / time; busbw = algbw * 2(N-1)/N for an
    all-reduce. The bound is the time the bytes an exchange actually sends need on one link."""
    import contextlib

    from ringps.launch.spawn import run_module

    if args.workers < 2:
        raise ConfigError(f"--workers {args.workers}: need at least 2 to exchange anything")
    rate = None
    if args.net:
        try:
            rate = parse_rate(args.net)
        except ValueError as e:
            raise ConfigError(f"--net {args.net}: {e}") from None
        from ringps.launch.cluster import Cluster, ClusterError, placement, requirements_missing

        why = requirements_missing()
        if why:
            raise ClusterError(why)
        ctx = Cluster.create([rate] * args.workers)
    else:
        ctx = contextlib.nullcontext()
    module_args = ["--sizes", args.sizes, "--densities", args.densities, "--repeats", str(args.repeats),
                   "--block", str(args.block)]
    with ctx as c:
        res = run_module("ringps.bench.comm", module_args, args.workers, placement(c) if c else None, timeout=3600)[0]
    n = res["world"]
    link = rate / 8 if rate else res["bandwidth"]
    console = wide_console()
    console.print(f"{n} workers, {'links ' + args.net + ' (tc tbf)' if rate else 'loopback'}; "
                  f"bound = bytes sent per worker / {link * 8 / 1e6:,.0f} Mbit/s"
                  f"{' (measured)' if not rate else ''}; times are medians of {args.repeats}")
    t = Table("exchange", "numel", "density", "select", "time", "write", "total", "bytes sent", "algbw", "busbw",
              "bound", "time/bound", "top-k mass recall")
    ms = lambda x: f"{x * 1e3:.1f} ms" if x else "-"  # noqa: E731
    for r in res["rows"]:
        tb = r["numel"] * 4
        algbw = tb / r["time_s"]
        busbw = algbw * 2 * (n - 1) / n if r["density"] == 1.0 else r["bytes_sent"] / r["time_s"]
        bound = r["bytes_sent"] / link
        total = r["select_s"] + r["time_s"] + r.get("write_s", 0.0)
        mark = " *" if r.get("chosen") else ""
        t.add_row(r["exchange"] + mark, f"{r['numel']:.0e}", f"{r['density']:g}", ms(r["select_s"]), ms(r["time_s"]),
                  ms(r.get("write_s")), ms(total), f"{r['bytes_sent'] / 1e6:.2f} MB", _gbit(algbw), _gbit(busbw),
                  f"{bound * 1e3:.1f} ms", f"{r['time_s'] / bound:.2f}",
                  f"{r['recall']:.3f}" if r.get("recall") is not None else "-")
    console.print(t)
    console.print("* the sparse exchange the cost model picks. select: local selection (the sampled top-k, or "
                  "shared-index's block scores); time: the exchange proper, from the selection until every rank "
                  "holds the sum; write: the dense average into the gradient; total: all three. algbw: "
                  "dense-equivalent bytes / time; sparse busbw: bytes actually sent / time. top-k mass recall: over "
                  "a run of error feedback on a fully connected layer's gradients, the share of the exact top-k "
                  "mass of each rank's accumulated residual that the positions it sent cover (1.0: exact top-k).")
    return 0


def run_ps(args: argparse.Namespace) -> int:
    from ringps.launch.spawn import run_module

    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: must be >= 1")
    from ringps.ps import POLICIES

    if POLICIES.get(args.policy).holds():  # an unknown name: ConfigError naming the known ones
        raise ConfigError(f"--policy {args.policy}: the throughput bench needs a policy where no push waits for another")
    module_args = ["--params", str(args.params), "--seconds", str(args.seconds), "--policy", args.policy]
    world = args.workers + 1
    console = wide_console()
    runs = [("loopback", None)]
    if args.slow_link:
        try:
            slow = parse_rate(args.slow_link)
        except ValueError as e:
            raise ConfigError(f"--slow-link {args.slow_link}: {e}") from None
        runs = [("all links 10gbit", [10e9] * world), (f"worker 0 at {args.slow_link}", [slow] + [10e9] * args.workers)]
    results = []
    for label, rates in runs:
        if rates is None:
            res = run_module("ringps.bench.ps", module_args, world, None, timeout=300)
        else:
            from ringps.launch.cluster import Cluster, ClusterError, placement, requirements_missing

            why = requirements_missing()
            if why:
                raise ClusterError(why)
            with Cluster.create(rates) as c:
                res = run_module("ringps.bench.ps", module_args, world, placement(c), timeout=300)
        results.append((label, res))
    t = Table("setting", "server pushes/s", "server peak RSS", "per worker", "pooled buffers", "copies/push",
              "worker pushes/s", "round trip (median)")
    for label, res in results:
        server = next(r for r in res if r["role"] == "server")
        ws = [r for r in res if r["role"] == "worker"]
        rss = server.get("peak_rss_bytes", 0)
        t.add_row(label, f"{server['pushes_per_s']:.1f}", f"{rss / 1e6:.0f} MB", f"{rss / 1e6 / args.workers:.1f} MB",
                  f"{server.get('buffer_bytes', 0) / server.get('shard_bytes', 1):.0f} x shard",
                  f"{server.get('copies_per_push', 0):.2f}",
                  ", ".join(f"w{r['rank']}: {r['pushes_per_s']:.1f}" for r in ws),
                  ", ".join(f"{1e3 * r['round_trip_median_s']:.1f} ms" for r in ws))
    console.print(f"{args.params:.0e} parameters ({args.params * 4 / 1e6:.0f} MB pushed and pulled per round trip), "
                  f"{args.workers} workers, 1 server, policy {args.policy}, {args.seconds:g}s each; per push the server "
                  "reads and writes its bytes: receive 1 write, SGD 3 passes (decay, momentum, update), snapshot "
                  "copy once per version (copies/push), send 1 read")
    console.print(t)
    if len(results) == 2:
        fast = [[r["pushes_per_s"] for r in res if r["role"] == "worker" and r["rank"] != 0] for _, res in results]
        a, b = sum(fast[0]) / len(fast[0]), sum(fast[1]) / len(fast[1])
        console.print(f"the other workers' push rate with worker 0 on the slow link: {b:.1f}/s vs {a:.1f}/s ({b / a:.2f}x)")
    return 0


def _gbit(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e9:.2f} Gbit/s"


def run(args: argparse.Namespace) -> int:
    return {"net": run_net, "comm": run_comm, "ps": run_ps}[args.what](args)
