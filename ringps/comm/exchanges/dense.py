"""`dense`: no selection, an all-reduce of everything (what auto picks where selection does not pay).

With `--value-dtype fp16|bf16` the hook sends a dense bucket in 16 bits, as DDP's fp16 compression
hook does (RingTopkState.dense_bucket), and it is priced so: on a link fast enough for dense, the
auto choice then weighs sparse against the 16-bit all-reduce a user would otherwise run."""

from __future__ import annotations

import torch.distributed as dist

from ringps.comm.exchanges.base import (
    EXCHANGES,
    Exchange,
    Reduced,
    _meter_ring,
)
from ringps.cost import B_VAL, Cost, ring_bytes


@EXCHANGES.register("dense")
class Dense(Exchange):
    name = "dense"

    @classmethod
    def cost(cls, n, k, N, p, block=256, value_bytes=B_VAL):
        sent = ring_bytes(n, N, value_bytes)
        passes = 2 if value_bytes == B_VAL else 4  # copy, divide; 16 bits: and the casts there and back
        return Cost(2 * (N - 1) * p.latency + sent / p.bandwidth, ring_bytes(n, N, 1) * p.reduce_s + passes * n * p.pass_s,
                    sent)

    def reduce(self, acc, segments, selector, ring, step, out=None):  # one phase: all-reduce in `out`
        out = acc.clone() if out is None else out.copy_(acc)
        dist.all_reduce(out, group=ring.group)
        _meter_ring(ring, self.name, out)
        return Reduced(out.div_(ring.size), None)
