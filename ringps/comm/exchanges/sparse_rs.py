"""`sparse-rs`: sparse ring reduce-scatter + all-gather; merged segments switch to dense values
when that becomes smaller (fill-in)."""

from __future__ import annotations

import torch

from ringps.comm.exchanges.base import (
    EXCHANGES,
    Exchange,
    Reduced,
    pack,
    unpack,
)
from ringps.compress.selectors import Selection
from ringps.cost import B_IDX, B_VAL, Cost


class _Part:
    """A segment of the ring reduce-scatter: sparse (sorted local idx, values) or dense values."""

    __slots__ = ("idx", "val", "dense")

    def __init__(self, idx=None, val=None, dense=None):
        self.idx, self.val, self.dense = idx, val, dense

    def merge(self, other: "_Part", length: int) -> "_Part":
        if self.dense is not None or other.dense is not None or self.idx.numel() + other.idx.numel() >= length // 2:
            d = self.to_dense(length)
            if other.dense is not None:
                d.add_(other.dense)
            else:
                d.index_add_(0, other.idx, other.val)
            return _Part(dense=d)
        idx = torch.cat([self.idx, other.idx])
        val = torch.cat([self.val, other.val])
        idx, order = torch.sort(idx, stable=True)
        uniq, inverse = torch.unique_consecutive(idx, return_inverse=True)
        return _Part(uniq, val.new_zeros(uniq.numel()).index_add_(0, inverse, val[order]))

    def to_dense(self, length: int) -> torch.Tensor:
        if self.dense is not None:
            return self.dense.clone()
        return self.val.new_zeros(length).index_add_(0, self.idx, self.val)

    def message(self) -> tuple[list[int], torch.Tensor]:
        """Whichever is smaller on the wire: (index, value) pairs or the dense values."""
        if self.dense is not None:
            return [self.dense.numel() * self.dense.element_size(), -1], self.dense.view(torch.uint8)
        msg = pack(Selection(self.idx, self.val))
        return [msg.numel(), self.idx.numel()], msg

    @staticmethod
    def from_message(header: list[int], msg: torch.Tensor, dtype: torch.dtype) -> "_Part":
        if header[1] < 0:
            return _Part(dense=msg.view(dtype).clone())
        sel = unpack(msg, header[1], dtype)
        return _Part(sel.indices, sel.values.clone())


@EXCHANGES.register("sparse-rs")
class SparseReduceScatter(Exchange):
    name = "sparse-rs"
    progress = 0.88  # the same update as allgather (the sum of every rank's own k), fitted with it

    @classmethod
    def cost(cls, n, k, N, p, block=256, value_bytes=B_VAL):
        seg, d = n / N, min(1.0, k / n)
        sent, merged = 0.0, 0.0
        for j in range(1, N):  # partial sums grow by fill-in as segments travel (values stay fp32)
            nnz = seg * (1 - (1 - d) ** j)
            sent += min(nnz * (B_IDX + B_VAL), seg * B_VAL)
            merged += nnz
        final = seg * (1 - (1 - d) ** N)
        sent += (N - 1) * min(final * (B_IDX + B_VAL), seg * B_VAL)
        cpu = n * p.select_s + k * p.scatter_s + merged * p.scatter_s * 3 + 2 * n * p.pass_s
        return Cost(4 * (N - 1) * p.latency + sent / p.bandwidth, cpu, sent, prep_s=n * p.select_s)

    def combine(self, acc, segments, sel, ring):
        n, N, r = acc.numel(), ring.size, ring.rank
        bounds = [n * j // N for j in range(N + 1)]
        cuts = torch.searchsorted(sel.indices, torch.tensor(bounds, device=sel.indices.device)).tolist()
        parts = [
            _Part(sel.indices[cuts[j] : cuts[j + 1]] - bounds[j], sel.values[cuts[j] : cuts[j + 1]]) for j in range(N)
        ]
        length = [bounds[j + 1] - bounds[j] for j in range(N)]
        for s in range(N - 1):  # reduce-scatter: afterwards rank r holds segment (r + 1) % N, summed
            send_j, recv_j = (r - s) % N, (r - s - 1) % N
            header, msg = parts[send_j].message()
            got_header, got = ring.step_varsize(msg, header, f"sparse reduce-scatter step {s}", self.name)
            parts[recv_j] = parts[recv_j].merge(_Part.from_message(got_header, got, acc.dtype), length[recv_j])
        for s in range(N - 1):  # all-gather the summed segments
            send_j, recv_j = (r + 1 - s) % N, (r - s) % N
            header, msg = parts[send_j].message()
            got_header, got = ring.step_varsize(msg, header, f"sparse all-gather step {s}", self.name)
            parts[recv_j] = _Part.from_message(got_header, got, acc.dtype)
        return parts, bounds, sel.indices

    def write(self, acc, combined, ring, out):
        parts, bounds, sent = combined
        out = torch.empty_like(acc) if out is None else out
        for j, part in enumerate(parts):
            dst = out[bounds[j] : bounds[j + 1]]
            if part.dense is not None:
                dst.copy_(part.dense)
            else:
                dst.zero_().index_add_(0, part.idx, part.val)
        return Reduced(out.div_(ring.size), sent)
