"""The per-rank side of `ringps bench comm`: time every exchange on the same inputs.

    python -m ringps.comm.bench --sizes 1e6,1e7 --densities 0.01,0.001 --repeats 5   (as N ranks)

For each size and density every rank draws its own gradient, the selection is made once, and
each exchange is timed on it: gloo's all_reduce and our dense ring on the whole tensor, and every
sparse exchange on the selection. A sparse exchange's three phases are timed apart: its local
selection (`select_s`: the sampled top-k, or shared-index's block scores), the exchange proper
(`time_s`: from the selection until every rank holds the summed contributions) and writing the
dense average (`write_s`). Rank 0 prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ringps.comm.meter import PayloadMeter
from ringps.comm.p2p import Ring
from ringps.comm.probe import measure_links
from ringps.comm.ring import ring_allreduce
from ringps.comm.sparse import Segment, build_exchange
from ringps.compress.selectors import SampledThreshold, Selection, Selector
from ringps.cost import SPARSE, CostParams, calibrate_cpu, choose_exchange

SPARSE_BENCH = ("allgather", "shared-index", "sparse-rs", "gloo-allgather")


class PreSelected(Selector):
    """Hands out a selection made beforehand, so the exchange alone is timed."""

    def __init__(self, sel: Selection):
        self.sel = sel

    def select(self, acc, k, step=0, key=0):
        return self.sel


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times[1:])], dtype=torch.float64)  # first one warms up
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the exchange is done when the slowest rank is
    return float(t)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1e6,1e7")
    p.add_argument("--densities", default="0.01,0.001")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--block", type=int, default=256)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank, N = dist.get_rank(), dist.get_world_size()
    latency, bandwidth = measure_links()
    cpu = calibrate_cpu() if rank == 0 else {}
    box = [cpu]
    dist.broadcast_object_list(box, src=0)
    params = CostParams(bandwidth=bandwidth, latency=latency, **box[0])
    rows = []
    for n in (int(float(s)) for s in args.sizes.split(",")):
        g = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        meter = PayloadMeter()
        ring = Ring(None, 600.0, meter)

        def bytes_of(fn) -> int:
            before = sum(meter.sent.values())
            fn()
            return sum(meter.sent.values()) - before

        dense_bytes = int(2 * (N - 1) / N * n * 4)
        rows.append({"exchange": "gloo all_reduce", "numel": n, "density": 1.0, "bytes_sent": dense_bytes,
                     "time_s": timed(lambda: dist.all_reduce(g.clone()), args.repeats), "select_s": 0.0})
        rows.append({"exchange": "dense ring", "numel": n, "density": 1.0,
                     "bytes_sent": bytes_of(lambda: ring_allreduce(g.clone(), ring)),
                     "time_s": timed(lambda: ring_allreduce(g.clone(), ring), args.repeats), "select_s": 0.0})
        for d in (float(s) for s in args.densities.split(",")):
            k = max(1, int(n * d))
            selector = SampledThreshold(seed=rank)
            t0 = time.perf_counter()
            sel = selector.select(g, k)
            select_s = time.perf_counter() - t0
            segs = [Segment(0, n, k, 0)]
            out = torch.empty_like(g)  # reused, as the hook reuses the gradient
            chosen, _ = choose_exchange(n, k, N, params, 0.0, candidates=SPARSE, block=args.block)
            for name in SPARSE_BENCH:
                ex = build_exchange(name, args.block)
                prepare = lambda: ex.prepare(g, segs, PreSelected(sel), 0)  # noqa: E731
                ex.combine(g, segs, prepare(), ring)  # a first step (shared-index: agrees on the first scores)
                prepared = prepare()  # a later step's: what every step but the first does
                combine = lambda: ex.combine(g, segs, prepared, ring)  # noqa: E731
                sent = bytes_of(combine)
                row = {"exchange": name, "numel": n, "density": d, "bytes_sent": sent, "chosen": name == chosen,
                       "time_s": timed(combine, args.repeats)}
                combined = combine()
                row["write_s"] = timed(lambda: ex.write(g, combined, ring, out), args.repeats)
                row["select_s"] = timed(prepare, args.repeats) if name == "shared-index" else select_s
                rows.append(row)
    if rank == 0:
        print(json.dumps({"world": N, "latency": latency, "bandwidth": bandwidth, "rows": rows}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
