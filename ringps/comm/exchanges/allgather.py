"""`allgather`: a ring all-gather of (index, value) pairs, then a scatter-add in rank order:
(N-1) k (b_i + b_v) bytes per worker, linear in N."""

from __future__ import annotations

from ringps.comm.exchanges.base import (
    EXCHANGES,
    Exchange,
    _scatter_parts,
    pack,
    unpack,
)
from ringps.compress.selectors import Selection
from ringps.cost import B_IDX, B_VAL, Cost


@EXCHANGES.register("allgather")
class AllGather(Exchange):
    name = "allgather"
    # every rank's own k: the median of 20 runs stopped at 90% beside allreduce's of their seed, 2-4
    # workers, 1 Gbit/s and 100 Mbit/s (0.57-1.25; benchmarks/sparse_progress.py, docs/RESULTS.md
    # §6); 0.79 before, from 3 runs of topk-allgather at 100 Mbit/s
    progress = 0.88
    messages = 2  # per ring step: a header and the payload

    @classmethod
    def cost(cls, n, k, N, p, block=256, value_bytes=B_VAL):
        sent = (N - 1) * k * (B_IDX + value_bytes)
        cpu = n * p.select_s + k * p.scatter_s + N * k * p.scatter_s + 2 * n * p.pass_s
        return Cost(cls.messages * (N - 1) * p.latency + sent / p.bandwidth, cpu, sent, prep_s=n * p.select_s)

    def combine(self, acc, segments, sel, ring):
        parts: list[Selection | None] = [None] * ring.size
        parts[ring.rank] = Selection(sel.indices, self.rounded(sel.values))
        msg, k = pack(Selection(sel.indices, sel.values.to(self.value_dtype))), sel.indices.numel()
        for s in range(ring.size - 1):  # pass each rank's message around the ring
            owner = (ring.rank - s - 1) % ring.size
            header, msg = ring.step_varsize(msg, [msg.numel(), k], f"sparse all-gather step {s}", self.name)
            k = header[1]
            got = unpack(msg, k, self.value_dtype)
            parts[owner] = Selection(got.indices, got.values.to(acc.dtype))
        return parts, sel.indices

    def write(self, acc, combined, ring, out):
        return _scatter_parts(*combined, acc, ring, out)
