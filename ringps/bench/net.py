"""`ringps bench net`: what the emulated links really carry, measured.

Per link: a TCP stream from host i to host i+1 (sequentially, so links do not share the
measurement), and during a gloo all_reduce over all hosts, the bytes eth0 sent per second.
Overall: the all_reduce's algbw and busbw (nccl-tests: busbw = algbw * 2(N-1)/N), each against
the configured rate. TCP and busbw count payload; tbf shapes whole packets, so about 4% of the
configured rate goes to headers.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from ringps.launch.cluster import Cluster, ClusterError, placement
from ringps.launch.spawn import run_module

PROBE = [sys.executable, "-m", "ringps.bench.netprobe"]
PORT = 5201


@dataclass
class LinkResult:
    host: int
    rate_bps: float
    tcp_bps: float  # host -> next host
    allreduce_tx_bps: float  # eth0 bytes sent per second during the all_reduce


@dataclass
class NetBenchResult:
    links: list[LinkResult]
    allreduce_bytes: int
    allreduce_s: float  # median
    algbw_bps: float
    busbw_bps: float
    rate_bps: float  # the slowest configured link: what busbw can reach
    description: str


def _json(p: subprocess.Popen, what: str, timeout: float) -> dict:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        raise ClusterError(f"{what}: no answer within {timeout:.0f}s") from None
    if p.returncode != 0:
        raise ClusterError(f"{what} failed: {(err or out).strip().splitlines()[-1:]}")
    return json.loads(out.strip().splitlines()[-1])


def tcp_link(c: Cluster, src: int, dst: int, seconds: float) -> float:
    nbytes = int(min(c.rates[src], c.rates[dst]) / 8 * seconds)
    recv = subprocess.Popen(c.exec_prefix(dst) + PROBE + ["tcp-recv", c.addr(dst), str(PORT)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    send = subprocess.Popen(c.exec_prefix(src) + PROBE + ["tcp-send", c.addr(dst), str(PORT), str(nbytes)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    limit = 30 + 4 * seconds
    _json(send, f"TCP send host {src} -> {dst}", limit)
    return _json(recv, f"TCP receive host {src} -> {dst}", limit)["bits_per_s"]


def allreduce(c: Cluster, seconds: float, iters: int) -> tuple[dict, list[dict[str, int]], list[dict[str, int]], float]:
    n = c.hosts
    slowest = min(c.rates)
    # size the tensor so one all_reduce takes about `seconds` on the slowest link
    nbytes = slowest / 8 * seconds / (2 * (n - 1) / n)
    numel = max(1024, int(nbytes / 4))
    before = c.counters()
    t0 = time.perf_counter()
    results = run_module("ringps.bench.netprobe", ["allreduce", str(numel), str(iters)], n, placement(c),
                         timeout=120 + 4 * seconds * (iters + 1))
    elapsed = time.perf_counter() - t0
    after = c.counters()
    return results[0], before, after, elapsed


def bench_net(rates: list[float], seconds: float = 1.0, iters: int = 3) -> NetBenchResult:
    with Cluster.create(rates) as c:
        n = c.hosts
        tcp = [tcp_link(c, h, (h + 1) % n, seconds) for h in range(n)] if n > 1 else [0.0]
        res, before, after, _ = allreduce(c, seconds, iters)
        t_med = statistics.median(res["times"])
        # the all_reduce traffic per host: timed iterations plus the warm-up one
        busy = sum(res["times"]) + t_med
        links = [
            LinkResult(h, c.rates[h], tcp[h], (after[h]["tx_bytes"] - before[h]["tx_bytes"]) * 8 / busy)
            for h in range(n)
        ]
        algbw = res["bytes"] * 8 / t_med
        return NetBenchResult(links, res["bytes"], t_med, algbw, algbw * 2 * (n - 1) / n, min(rates), c.describe())
