"""Sparse exchanges: sum k-sparse vectors over N workers and return the average, dense.

Each exchange takes the accumulated gradient `acc` of a bucket (flat), the bucket's segments
(one per large tensor, with its own k), a selector and an `out` buffer of acc's size; it writes
the averaged update into `out` and returns the local positions that count as sent (the memory
keeps the rest). `out` is reused by the caller (often the gradient itself): no per-step
allocation of bucket-sized tensors.

- `allgather`      ring all-gather of (index, value) pairs, then a scatter-add in rank order:
                   (N-1) k (b_i + b_v) bytes per worker, linear in N.
- `shared-index`   the workers agree on one set of blocks (block norms all-reduced, the top
                   blocks taken), then all-reduce only those values: ~2(N-1)/N (k + n/B) b_v.
                   With a selector that already picks the same positions everywhere (randomk)
                   the block step is skipped.
- `sparse-rs`      sparse ring reduce-scatter + all-gather; merged segments switch to dense
                   values when that becomes smaller (fill-in).
- `gloo-allgather` GRACE/DGC's way: torch.distributed.all_gather of padded (index, value)
                   pairs. The public peer, for comparisons.
- `dense`          no selection: all-reduce everything (what the cost model picks when
                   selection does not pay).

Every rank applies the same bits: sums run in rank order or each element is summed once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from ringps.comm.p2p import Ring
from ringps.compress.selectors import Selection, Selector
from ringps.registry import Registry

EXCHANGES: Registry = Registry("exchange")
IDX = torch.int32  # indices on the wire: 4 bytes (a bucket never reaches 2**31 entries)


class Segment(NamedTuple):
    offset: int  # where the tensor starts in the bucket's flat buffer
    numel: int
    k: int  # entries to send from it
    key: int  # stable id (for randomk's generator)


class Reduced(NamedTuple):
    update: torch.Tensor  # (n,) dense, averaged over ranks (the `out` buffer)
    sent: torch.Tensor | None  # (m,) int64 sorted local positions that went out; None: all of them


def select_segments(acc: torch.Tensor, segments: list[Segment], selector: Selector, step: int) -> Selection:
    idx, val = [], []
    for s in segments:
        sel = selector.select(acc[s.offset : s.offset + s.numel], s.k, step, s.key)
        idx.append(sel.indices + s.offset)
        val.append(sel.values)
    if not idx:
        return Selection(torch.empty(0, dtype=torch.long), acc.new_empty(0))
    return Selection(torch.cat(idx), torch.cat(val))


def pack(sel: Selection) -> torch.Tensor:
    """(index, value) pairs as one byte message: k int32 indices, then k values."""
    return torch.cat([sel.indices.to(IDX).view(torch.uint8), sel.values.contiguous().view(torch.uint8)])


def unpack(msg: torch.Tensor, k: int, dtype: torch.dtype) -> Selection:
    ib = k * torch.empty(0, dtype=IDX).element_size()
    return Selection(msg[:ib].view(IDX).long(), msg[ib:].view(dtype))


class Exchange:
    name = ""
    uses_selection = True  # False: sends everything (dense)

    def reduce(self, acc: torch.Tensor, segments: list[Segment], selector: Selector, ring: Ring, step: int,
               out: torch.Tensor | None = None) -> Reduced:
        raise NotImplementedError


def _meter_ring(ring: Ring, name: str, t: torch.Tensor) -> None:
    """Bytes a ring all-reduce of `t` sends (and receives) per rank."""
    if ring.meter is not None:
        nbytes = 2 * (ring.size - 1) * t.numel() * t.element_size() // ring.size
        ring.meter.add(name, nbytes, nbytes)


@EXCHANGES.register("dense")
class Dense(Exchange):
    name, uses_selection = "dense", False

    def reduce(self, acc, segments, selector, ring, step, out=None):
        out = acc.clone() if out is None else out.copy_(acc)
        dist.all_reduce(out, group=ring.group)
        _meter_ring(ring, self.name, out)
        return Reduced(out.div_(ring.size), None)


@EXCHANGES.register("allgather")
class AllGather(Exchange):
    name = "allgather"

    def reduce(self, acc, segments, selector, ring, step, out=None):
        sel = select_segments(acc, segments, selector, step)
        parts: list[Selection | None] = [None] * ring.size
        parts[ring.rank] = sel
        msg, k = pack(sel), sel.indices.numel()
        for s in range(ring.size - 1):  # pass each rank's message around the ring
            owner = (ring.rank - s - 1) % ring.size
            header, msg = ring.step_varsize(msg, [msg.numel(), k], f"sparse all-gather step {s}", self.name)
            k = header[1]
            parts[owner] = unpack(msg, k, acc.dtype)
        out = torch.zeros_like(acc) if out is None else out.zero_()
        for p in parts:  # rank order: identical sums everywhere
            out.index_add_(0, p.indices, p.values)
        return Reduced(out.div_(ring.size), sel.indices)


@EXCHANGES.register("gloo-allgather")
class GlooAllGather(Exchange):
    """torch.distributed.all_gather of (index, value) padded to the largest k (GRACE, DGC)."""

    name = "gloo-allgather"

    def reduce(self, acc, segments, selector, ring, step, out=None):
        sel = select_segments(acc, segments, selector, step)
        k = torch.tensor([sel.indices.numel()])
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
        out = torch.zeros_like(acc) if out is None else out.zero_()
        for c, m in zip(counts, got):
            p = unpack(m, kmax, acc.dtype)
            out.index_add_(0, p.indices[: int(c)], p.values[: int(c)])
        return Reduced(out.div_(ring.size), sel.indices)


@EXCHANGES.register("shared-index")
class SharedIndex(Exchange):
    """One index set for all: the globally largest blocks (by summed squared norm), then a dense
    all-reduce of just their values. Entries a worker had outside the set stay in its residual."""

    name = "shared-index"

    def __init__(self, block: int = 256):
        self.block = block

    def blocks(self, acc: torch.Tensor, segments: list[Segment], ring: Ring) -> torch.Tensor:
        """Flat positions of the chosen blocks' entries, the same on every rank."""
        B = self.block
        scores = []
        for s in segments:
            seg = acc[s.offset : s.offset + s.numel]
            whole = s.numel // B * B  # norms of the full blocks straight from a view, no copy
            parts = [torch.linalg.vector_norm(seg[:whole].view(-1, B), dim=1).square_()]
            if whole < s.numel:
                parts.append(seg[whole:].square().sum().view(1))
            scores.append(torch.cat(parts) if len(parts) > 1 else parts[0])
        allscores = torch.cat(scores)
        dist.all_reduce(allscores, group=ring.group)
        _meter_ring(ring, self.name, allscores)
        picked, start = [], 0
        for s, sc in zip(segments, scores):
            nb = sc.numel()
            kb = min(nb, -(-s.k // B))
            if kb > 0:
                top = torch.topk(allscores[start : start + nb], kb, sorted=False).indices.sort().values
                pos = (top.unsqueeze(1) * B + torch.arange(B)).flatten()
                picked.append(pos[pos < s.numel] + s.offset)
            start += nb
        return torch.cat(picked) if picked else torch.empty(0, dtype=torch.long)

    def reduce(self, acc, segments, selector, ring, step, out=None):
        if selector.shared_indices:
            idx = select_segments(acc, segments, selector, step).indices
        else:
            idx = self.blocks(acc, segments, ring)
        values = acc[idx]
        if values.numel() > 0:  # k is the same on every rank, so all skip together
            dist.all_reduce(values, group=ring.group)
            _meter_ring(ring, self.name, values)
        out = torch.zeros_like(acc) if out is None else out.zero_()
        out[idx] = values.div_(ring.size)
        return Reduced(out, idx)


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
        return _Part(uniq, torch.zeros(uniq.numel(), dtype=val.dtype).index_add_(0, inverse, val[order]))

    def to_dense(self, length: int) -> torch.Tensor:
        if self.dense is not None:
            return self.dense.clone()
        return torch.zeros(length, dtype=self.val.dtype).index_add_(0, self.idx, self.val)

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

    def reduce(self, acc, segments, selector, ring, step, out=None):
        sel = select_segments(acc, segments, selector, step)
        n, N, r = acc.numel(), ring.size, ring.rank
        bounds = [n * j // N for j in range(N + 1)]
        cuts = torch.searchsorted(sel.indices, torch.tensor(bounds)).tolist()
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
        out = torch.empty_like(acc) if out is None else out
        for j in range(N):
            part, dst = parts[j], out[bounds[j] : bounds[j + 1]]
            if part.dense is not None:
                dst.copy_(part.dense)
            else:
                dst.zero_().index_add_(0, part.idx, part.val)
        return Reduced(out.div_(N), sel.indices)
