"""`gloo-allgather`: GRACE's and DGC's way, torch.distributed.all_gather of padded (index, value) pairs."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringps.comm.exchanges.base import (
    EXCHANGES,
    Exchange,
    _scatter_parts,
    pack,
    unpack,
)
from ringps.compress.selectors import Selection
from ringps.cost import B_IDX, B_VAL, Cost


@EXCHANGES.register("gloo-allgather")
class GlooAllGather(Exchange):
    """torch.distributed.all_gather of (index, value) padded to the largest k (GRACE, DGC)."""

    name = "gloo-allgather"
    progress = 0.88  # the same update as allgather
    auto = False  # the public peer, for comparisons

    @classmethod
    def cost(cls, n, k, N, p, block=256, value_bytes=B_VAL):
        sent = (N - 1) * k * (B_IDX + B_VAL)
        cpu = n * p.select_s + k * p.scatter_s + N * k * p.scatter_s + 2 * n * p.pass_s
        return Cost(3 * (N - 1) * p.latency + sent / p.bandwidth, cpu, sent, prep_s=n * p.select_s)

    def combine(self, acc, segments, sel, ring):
        k = torch.tensor([sel.indices.numel()], device=sel.values.device)
        counts = [torch.zeros_like(k) for _ in range(ring.size)]
        dist.all_gather(counts, k, group=ring.group)
        kmax = max(int(c) for c in counts)
        pad = kmax - sel.indices.numel()
        padded = Selection(torch.cat([sel.indices, sel.indices.new_zeros(pad)]), torch.cat([sel.values, sel.values.new_zeros(pad)]))
        msg = pack(padded)
        got = [torch.empty_like(msg) for _ in range(ring.size)]
        dist.all_gather(got, msg, group=ring.group)
        if ring.meter is not None:
            nbytes = (ring.size - 1) * msg.numel()
            ring.meter.add(self.name, nbytes, nbytes)
        parts = []
        for c, m in zip(counts, got):
            p = unpack(m, kmax, acc.dtype)
            parts.append(Selection(p.indices[: int(c)], p.values[: int(c)]))
        return parts, sel.indices

    def write(self, acc, combined, ring, out):
        return _scatter_parts(*combined, acc, ring, out)
