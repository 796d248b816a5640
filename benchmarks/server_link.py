"""Benchmark: what a parameter server's emulated link carries while k workers push to it and it
replies to each of them, all at once (plain TCP, no ringps job), against one direction alone.

Why: the simulator prices a server's link at one efficiency, fitted on 2-worker runs
(sim/calibrate.py), and under-predicts the parameter servers at 100 Mbit/s with 3 and 4 workers
(docs/RESULTS.md §6). This measures whether the link itself carries less as flows are added: one
emulated host per worker plus the server's, each with tc tbf at --net (launch/cluster.py); a
push and a reply of facenet's size (42.8 MB) per worker; k = 1..4, interleaved per repeat; the
pushes alone (k senders into the server's ingress queue), the replies alone (the server's k
flows through its own egress queue) and both at once.

    .venv/bin/python benchmarks/server_link.py --net 100mbit --repeats 5
    .venv/bin/python benchmarks/server_link.py --runs runs/bench-sim/w4-100mbit/ps-*   # runs nothing

`--runs` reads parameter-server run folders instead: from the server's trace (its receive and
reply spans) and the workers' byte counts, how busy each direction of its link was, how long both
were, and what each carried while busy, as a fraction of the configured rate.
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

from ringps import trace
from ringps.bench.net import PROBE, _json
from ringps.config import parse_rate
from ringps.errors import ConfigError
from ringps.launch.cluster import Cluster

BYTES = 42_780_000  # facenet's push, and its reply: 10.7M fp32 values
PORT = 5300
HOWS = ("push only", "reply only", "push and reply")  # k workers -> server, server -> k workers, both at once


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


def union(spans: list[tuple[float, float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlap(u: list[list[float]], v: list[list[float]]) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in u for c, d in v)


def link_use(run: Path) -> dict:
    """A parameter-server run's server link, from its trace: each direction's busy fraction, both
    at once, and the bytes it carried while busy against the configured rate."""
    if not (run / "summary.json").is_file():
        raise ConfigError(f"{run}: no summary.json (give a finished run's folder)")
    summary = json.loads((run / "summary.json").read_text())
    server = next((d for f in sorted((run / "trace").glob("rank-*.json")) if "(server)" in json.dumps(
        (d := trace.load(f))["traceEvents"][:1])), None)
    if server is None or len(summary.get("servers", {})) != 1:
        raise ConfigError(f"{run}: no single server's trace (a one-server parameter-server run with tracing on)")
    spans = {k: union([(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in server["traceEvents"] if e.get("name") == k])
             for k in ("receive", "reply")}
    lo, hi = min(u[0][0] for u in spans.values()), max(u[-1][1] for u in spans.values())
    busy = {k: sum(b - a for a, b in u) for k, u in spans.items()}
    rate = parse_rate(summary["net"]) / 8
    moved = {"receive": sum(w["bytes_sent"] for w in summary["per_worker"].values()),
             "reply": sum(w["bytes_recv"] for w in summary["per_worker"].values())}
    return {"run": str(run), "workers": summary["workers"], "in_busy": busy["receive"] / (hi - lo),
            "out_busy": busy["reply"] / (hi - lo), "both": overlap(spans["receive"], spans["reply"]) / (hi - lo),
            "in_rate": moved["receive"] / busy["receive"] / rate, "out_rate": moved["reply"] / busy["reply"] / rate}


def read_runs(runs: list[Path]) -> None:
    t = Table(title="the server's link in parameter-server runs (fractions of the run; rates of the configured rate)")
    for col in ("run", "workers", "in busy", "out busy", "both", "in rate when busy", "out rate when busy"):
        t.add_column(col)
    for r in runs:
        u = link_use(r)
        t.add_row(escape(u["run"]), str(u["workers"]), *(f"{u[k]:.2f}" for k in ("in_busy", "out_busy", "both", "in_rate", "out_rate")))
    console.print(t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net", default="100mbit", help="every host's link rate (tc tbf)")
    p.add_argument("--workers", default="1,2,3,4", help="the k to measure, comma-separated")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--runs", nargs="+", type=Path, help="parameter-server run folders to read instead (runs nothing)")
    add_out_arg(p)
    args = p.parse_args()
    if args.runs:
        return read_runs(args.runs)
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
                                   ("reply only", [(srv, h) for h in range(k)]),
                                   ("push and reply", [(h, srv) for h in range(k)] + [(srv, h) for h in range(k)])):
                    e = ideal / transfer(c, pairs, BYTES)
                    eff.setdefault((k, how), []).append(round(e, 4))
                    console.print(f"repeat {rep}, {k} worker(s), {how}: efficiency {e:.3f}")
    t = Table(title=escape(f"the server's link at {args.net}: bytes each way / configured rate / wall "
                           f"(median [min..max] of {args.repeats})"))
    for col in ("workers", *HOWS, "push and reply, each repeat"):
        t.add_column(col)
    lines = [f"server link, {args.net}, {BYTES} bytes a push and a reply, {args.repeats} repeats"]
    for k in ks:
        cells = [f"{statistics.median(eff[k, how]):.3f} [{min(eff[k, how]):.3f}..{max(eff[k, how]):.3f}]" for how in HOWS]
        each = " ".join(f"{x:.2f}" for x in eff[k, "push and reply"])
        t.add_row(str(k), *cells, each)
        lines.append(f"{k} worker(s): " + "; ".join(f"{how} {c}" for how, c in zip(HOWS, cells)) + f" ({each})")
    console.print(t)
    (out / "results.json").write_text(json.dumps({f"{k}/{how}": v for (k, how), v in eff.items()}, indent=1) + "\n")
    write_report(out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    guarded(main)
