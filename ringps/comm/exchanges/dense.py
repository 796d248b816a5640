"""`dense` and `dense-fp16`: no selection, an all-reduce of the whole bucket (what auto picks where
selection does not pay).

`dense` sends the bucket in the values' dtype: fp32 by default, 16 bits with `--value-dtype
fp16|bf16`. `dense-fp16` always sends it in fp16, as DDP's fp16 compression hook does: on a link
fast enough for dense, the auto choice weighs sparse fp32 updates against the 16-bit all-reduce a
user would otherwise run (fp16 DDP reached the target in as many steps as fp32 DDP, docs/RESULTS.md
§1), and a user who keeps the default fp32 values still gets it there. Both are `whole`: the hook
all-reduces the bucket itself (RingTopkState.dense_bucket), small tensors included. At density 1
auto leaves `dense-fp16` out: a user who asks for no compression gets plain DDP's sums.
"""

from __future__ import annotations

import torch
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
    whole = True

    @classmethod
    def cost(cls, n, k, N, p, block=256, value_bytes=B_VAL):
        value_bytes = cls.wire_bytes(value_bytes)
        sent = ring_bytes(n, N, value_bytes)
        passes = 2 if value_bytes == B_VAL else 4  # copy, divide; 16 bits: and the casts there and back
        return Cost(2 * (N - 1) * p.latency + sent / p.bandwidth, ring_bytes(n, N, 1) * p.reduce_s + passes * n * p.pass_s,
                    sent)

    def reduce(self, acc, segments, selector, ring, step, out=None):  # one phase: all-reduce in `out`
        out = acc.clone() if out is None else out.copy_(acc)
        if out.dtype == self.value_dtype:
            dist.all_reduce(out, group=ring.group)
            _meter_ring(ring, self.name, out)
            return Reduced(out.div_(ring.size), None)
        wire = out.to(self.value_dtype).div_(ring.size)  # cast, then divide, as DDP's fp16 hook: the sum stays in range
        dist.all_reduce(wire, group=ring.group)
        _meter_ring(ring, self.name, wire)
        return Reduced(out.copy_(wire), None)


@EXCHANGES.register("dense-fp16")
class DenseFp16(Dense):
    name = "dense-fp16"
    fixed_dtype = value_dtype = torch.float16
    lossy = True
