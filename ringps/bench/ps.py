"""The per-rank side of `ringps bench ps`: workers push-and-pull as fast as they can.

    python -m ringps.bench.ps --params 1e6 --seconds 5       (as W workers + 1 server)

No model compute: a flat 1-D parameter of the given size under the given policy (async by
default; vsgd adds its value sample to every push). Every worker reports its pushes and round
trips; the server its pushes per second (first push to last), its peak resident memory, what
its pooled buffers hold, and how many times it copied the values into a reply snapshot.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from ringps.comm.group import init_from_env
from ringps.config import validate
from ringps.malloc import keep_freed_memory
from ringps.ps import POLICIES
from ringps.ps.client import Client
from ringps.ps.layout import Layout, flatten_into
from ringps.ps.server import Server


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--params", type=float, default=1e6)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--policy", default="async")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_memory()  # as training workers run
    init_from_env("gloo", 300.0)
    rank, world = dist.get_rank(), dist.get_world_size()
    server_rank, workers = world - 1, list(range(world - 1))
    model = nn.Module()
    model.w = nn.Parameter(torch.zeros(int(args.params)))
    layout = Layout.of(model, servers=1)
    cfg = validate({})
    policy = POLICIES.build(args.policy, cfg)
    if rank == server_rank:
        server = Server(rank, 0, workers, layout, policy, model.w.detach().clone(), 0.9, 0.0, timeout=120.0)
        server.serve()
        stats = server.stats()
        pushes = stats["pushes_applied"] + stats["pushes_dropped"]
        print(json.dumps({"role": "server", "pushes_per_s": stats["pushes_per_s"], "pushes": pushes,
                          "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                          "buffer_bytes": stats["buffer_bytes"], "shard_bytes": server.n * 4,
                          "copies_per_push": stats["snapshot_copies"] / max(1, pushes)}), flush=True)
    else:
        values, grads = flatten_into(model, layout)
        fraction = cfg.ps.vsgd_sample if policy.needs_sample else None
        client = Client(rank, (server_rank,), layout, values, grads, timeout=120.0, sample_fraction=fraction)
        client.pull()
        grads.normal_()
        trips, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            trips.append(client.push_pull(0.01, len(trips) + 1).round_trip_s)
        elapsed = time.perf_counter() - t0
        client.stop()
        print(json.dumps({"role": "worker", "rank": rank, "pushes": len(trips), "pushes_per_s": len(trips) / elapsed,
                          "round_trip_median_s": statistics.median(trips)}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
