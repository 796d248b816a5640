"""Benchmark: what a parameter server's emulated link carries while k workers push to it and it
replies to each of them, all at once (plain TCP, no ringps job), against one direction alone.

Why: the simulator prices a server's link at one efficiency, fitted on 2-worker runs
(sim/calibrate.py), and under-predicts the parameter servers at 100 Mbit/s with 3 and 4 workers
(docs/RESULTS.md §6). This measures whether the link itself carries less as flows are added: one
emulated host per worker plus the server's, each with tc tbf at --net (launch/cluster.py); a
push and a reply of facenet's size (42.8 MB) per worker; k = 1..4, interleaved per repeat.

    .venv/bin/python benchmarks/server_link.py --net 100mbit --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from common import add_out_arg, console, guarded, write_report
from rich.markup import escape
from rich.table import Table

from ringps.bench.net import PROBE, _json
from ringps.config import parse_rate
from ringps.launch.cluster import Cluster

BYTES = 42_780_000  # facenet's push, and its reply: 10.7M fp32 values
PORT = 5300


def transfer(c: Cluster, pairs: list[tuple[int, int]], nbytes: int) -> float:
    """Seconds from the first byte received until the last, all pairs sending at once (the
    receivers' clocks: the senders' start-up is not the link's)."""
    recvs = [subprocess.Popen(c.exec_prefix(d) + PROBE + ["tcp-recv", c.addr(d), str(PORT + i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i, (_, d) in enumerate(pairs)]
    time.sleep(0.5)  # the receivers listen before anyone sends (tcp-send retries too, for 20 s)
    sends = [subprocess.Popen(c.exec_prefix(s) + PROBE + ["tcp-send", c.addr(d), str(PORT + i), str(nbytes)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i, (s, d) in enumerate(pairs)]
    limit = 60 + 40 * nbytes * 8 * len(pairs) / min(c.rates)  # 40x the ideal time: a stall, not a slow link
    for i, p in enumerate(sends):
        _json(p, f"TCP send {pairs[i][0]} -> {pairs[i][1]}", limit)
    got = [_json(p, f"TCP receive {pairs[i][0]} -> {pairs[i][1]}", limit) for i, p in enumerate(recvs)]
    return max(g["last"] for g in got) - min(g["first"] for g in got)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net", default="100mbit", help="every host's link rate (tc tbf)")
    p.add_argument("--workers", default="1,2,3,4", help="the k to measure, comma-separated")
    p.add_argument("--repeats", type=int, default=5)
    add_out_arg(p)
    args = p.parse_args()
    rate, ks = parse_rate(args.net), [int(k) for k in args.workers.split(",")]
    out = args.out or Path("runs/bench-server-link")
    out.mkdir(parents=True, exist_ok=True)
    eff: dict[tuple[int, str], list[float]] = {}
    with Cluster.create([rate] * (max(ks) + 1)) as c:
        srv = max(ks)
        for rep in range(args.repeats):
            for k in ks:
                ideal = k * BYTES * 8 / rate  # one direction's bytes at the configured rate
                for how, pairs in (("push only", [(h, srv) for h in range(k)]),
                                   ("push and reply", [(h, srv) for h in range(k)] + [(srv, h) for h in range(k)])):
                    e = ideal / transfer(c, pairs, BYTES)
                    eff.setdefault((k, how), []).append(round(e, 4))
                    console.print(f"repeat {rep}, {k} worker(s), {how}: efficiency {e:.3f}")
    t = Table(title=escape(f"the server's link at {args.net}: bytes each way / configured rate / wall "
                           f"(median [min..max] of {args.repeats})"))
    for col in ("workers", "push only", "push and reply", "push and reply, each repeat"):
        t.add_column(col)
    lines = [f"server link, {args.net}, {BYTES} bytes a push and a reply, {args.repeats} repeats"]
    for k in ks:
        cells = [f"{statistics.median(v):.3f} [{min(v):.3f}..{max(v):.3f}]" for v in (eff[k, "push only"], eff[k, "push and reply"])]
        each = " ".join(f"{x:.2f}" for x in eff[k, "push and reply"])
        t.add_row(str(k), *cells, each)
        lines.append(f"{k} worker(s): push only {cells[0]}; push and reply {cells[1]} ({each})")
    console.print(t)
    (out / "results.json").write_text(json.dumps({f"{k}/{how}": v for (k, how), v in eff.items()}, indent=1) + "\n")
    write_report(out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    guarded(main)
