"""The per-rank side of `ringps bench comm`: time every exchange on the same inputs.

    python -m ringps.bench.comm --sizes 1e6,1e7 --densities 0.01,0.001 --repeats 5   (as N ranks)

For each size and density every rank draws its own gradient, the selection is made once, and
each exchange is timed on it: gloo's all_reduce and our dense ring on the whole tensor, and every
sparse exchange on the selection. A sparse exchange's three phases are timed apart: its local
selection (`select_s`: the sampled top-k, or shared-index's block scores), the exchange proper
(`time_s`: from the selection until every rank holds the summed contributions) and writing the
dense average (`write_s`). Rank 0 prints one JSON line.

Selection quality (`recall`): each sparse exchange also runs a short training-like sequence,
error feedback over `--recall-steps` steps of a fully-connected layer's gradient (outer products
of a batch's deltas and ReLU inputs whose column scales persist), and reports the recall of the
true top-k mass: per rank and step, the share of the mass of the exact top k of the accumulated
residual (sum of |acc| over those k) that the positions it really sent cover. 1.0 is what an
exact per-rank top-k reaches; shared-index sends one set of blocks for all ranks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

from ringps.comm.exchanges import EXCHANGES, Segment, auto_candidates, build_exchange, choose_exchange
from ringps.comm.group import init_from_env
from ringps.comm.meter import PayloadMeter
from ringps.comm.p2p import Ring
from ringps.comm.probe import calibrate_cpu, measure_links
from ringps.comm.ring import ring_allreduce
from ringps.compress.memory import ErrorFeedback
from ringps.compress.selectors import SampledThreshold, Selection, Selector
from ringps.cost import CostParams, ring_bytes
from ringps.malloc import keep_freed_memory

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


def fc_gradient(n: int, rank: int, step: int, batch: int = 8) -> torch.Tensor:
    """A fully connected layer's gradient, delta^T x, for rows x cols ~ n: ReLU inputs whose
    per-column scale is the same every step (some input features matter more), fresh deltas."""
    cols = max(1, int(n ** 0.5))
    rows = n // cols
    scale = torch.rand(cols, generator=torch.Generator().manual_seed(7)) ** 3
    g = torch.Generator().manual_seed(1_000 * rank + step + 1)
    x = torch.relu(torch.randn(batch, cols, generator=g)) * scale
    delta = torch.randn(batch, rows, generator=g)
    out = torch.zeros(n)
    out[: rows * cols] = (delta.t() @ x).flatten()
    return out


def recall(name: str, n: int, k: int, ring: Ring, steps: int, block: int, rank: int) -> float:
    """Mean over ranks and steps (the first, where shared-index agrees on scores, left out) of the
    share of the exact top-k's mass of the accumulated residual that the sent positions cover."""
    ex, mem, sel = build_exchange(name, block), ErrorFeedback(), SampledThreshold(seed=rank)
    out, shares = torch.empty(n), []
    for t in range(steps):
        g = fc_gradient(n, rank, t)
        acc = mem.compensate("w", g)
        mag = acc.abs()
        top = torch.zeros(n, dtype=torch.bool)
        top[torch.topk(mag, k, sorted=False).indices] = True
        sent = ex.reduce(acc, [Segment(0, n, k, 0, "w", g)], sel, ring, t, out).sent
        hit = top.clone() if sent is None else torch.zeros(n, dtype=torch.bool).index_fill_(0, sent, True) & top
        if t > 0:
            shares.append(float(mag[hit].sum() / mag[top].sum()))
        mem.update("w", sent)
    share = torch.tensor([sum(shares) / max(1, len(shares))], dtype=torch.float64)
    dist.all_reduce(share)
    return float(share) / ring.size


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1e6,1e7")
    p.add_argument("--densities", default="0.01,0.001")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--recall-steps", type=int, default=12)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_memory()  # as training workers run
    init_from_env("gloo", 600.0)
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

        dense_bytes = int(ring_bytes(n, N))
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
            chosen, _ = choose_exchange(n, k, N, params, 0.0, candidates=tuple(c for c in auto_candidates() if not EXCHANGES.get(c).whole), block=args.block)
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
                if args.recall_steps > 1:
                    row["recall"] = recall(name, n, k, ring, args.recall_steps, args.block, rank)
                rows.append(row)
    if rank == 0:
        print(json.dumps({"world": N, "latency": latency, "bandwidth": bandwidth, "rows": rows}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
