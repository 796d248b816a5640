"""Sparse exchanges: sum k-sparse vectors over N workers and return the average, dense.

Each exchange takes the accumulated gradient `acc` of a bucket (flat), the bucket's segments
(one per large tensor, with its own k), a selector and an `out` buffer of acc's size; it writes
the averaged update into `out` and returns the local positions that count as sent (the memory
keeps the rest). `out` is reused by the caller (often the gradient itself): no per-step
allocation of bucket-sized tensors.

`reduce` runs three phases, kept apart so `ringps bench comm` can time the communication alone:
`prepare` (local: the selection, or shared-index's block scores), `combine` (the messages: every
rank ends with the same summed contributions) and `write` (local: the average into `out`).

- `allgather`      ring all-gather of (index, value) pairs, then a scatter-add in rank order:
                   (N-1) k (b_i + b_v) bytes per worker, linear in N.
- `shared-index`   the workers agree on one set of blocks (the top blocks of the all-reduced
                   block scores) and all-reduce only those values: ~2(N-1)/N (k + n/B) b_v, in
                   one all-reduce per step (the scores ride with the values, one step ahead).
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

import time
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist

from ringps import trace
from ringps.comm.p2p import Ring
from ringps.comm.ring import ring_allreduce
from ringps.compress.selectors import Selection, Selector
from ringps.registry import Registry

EXCHANGES: Registry = Registry("exchange")
IDX = torch.int32  # indices on the wire: 4 bytes (a bucket never reaches 2**31 entries)


class Segment(NamedTuple):
    offset: int  # where the tensor starts in the bucket's flat buffer
    numel: int
    k: int  # entries to send from it
    key: int  # stable id (for randomk's generator)
    name: str = ""  # the tensor's name: keys state an exchange keeps per tensor (shared-index's scores)
    grad: Optional[torch.Tensor] = None  # the step's own gradient (flat), before the memory folded it in

    @property
    def id(self) -> str:
        return self.name or f"#{self.key}"


class Reduced(NamedTuple):
    update: torch.Tensor  # (n,) dense, averaged over ranks (the `out` buffer)
    sent: torch.Tensor | None  # (m,) int64 sorted local positions that went out; None: all of them


VALUE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def build_exchange(name: str, block: int = 256, value_dtype: str = "fp32") -> "Exchange":
    """A fresh exchange by name (shared-index takes the block size); `value_dtype`: what the
    selected values travel in (allgather, shared-index; sums are taken in fp32)."""
    ex = EXCHANGES.build(name, block) if name == "shared-index" else EXCHANGES.build(name)
    ex.value_dtype = VALUE_DTYPES[value_dtype]
    return ex


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
    value_dtype = torch.float32  # what values travel in (sums stay fp32)

    def rounded(self, values: torch.Tensor) -> torch.Tensor:
        """`values` as the wire carries them (a rank's own contribution must be what the others
        receive, or the replicas drift apart); the rounding error is not kept in the residual."""
        return values if self.value_dtype == values.dtype else values.to(self.value_dtype).to(values.dtype)

    def prepare(self, acc: torch.Tensor, segments: list[Segment], selector: Selector, step: int) -> Any:
        """Local work before the first message (no communication): by default the selection."""
        return select_segments(acc, segments, selector, step)

    def combine(self, acc: torch.Tensor, segments: list[Segment], prepared: Any, ring: Ring) -> Any:
        """The communication: afterwards every rank holds the same contributions."""
        raise NotImplementedError

    def write(self, acc: torch.Tensor, combined: Any, ring: Ring, out: torch.Tensor | None) -> Reduced:
        """Local: the averaged update into `out` (dense), and the positions that went out."""
        raise NotImplementedError

    def reduce(self, acc: torch.Tensor, segments: list[Segment], selector: Selector, ring: Ring, step: int,
               out: torch.Tensor | None = None) -> Reduced:
        tr = trace.get()
        t0 = time.perf_counter()
        prepared = self.prepare(acc, segments, selector, step)
        t1 = time.perf_counter()
        sent = sum(ring.meter.sent.values()) if ring.meter is not None else 0
        combined = self.combine(acc, segments, prepared, ring)
        t2 = time.perf_counter()
        reduced = self.write(acc, combined, ring, out)
        if tr.enabled:
            n, k = acc.numel(), sum(s.k for s in segments)
            nbytes = (sum(ring.meter.sent.values()) - sent) if ring.meter is not None else None
            tr.add(f"{self.name}: prepare", "comm", t0, t1, exchange=self.name)
            tr.add(f"{self.name}: combine", "comm", t1, t2, exchange=self.name, bytes=nbytes, density=k / max(1, n))
            tr.add(f"{self.name}: write", "comm", t2, time.perf_counter(), exchange=self.name)
        return reduced

    def state_dict(self) -> dict[str, Any]:
        """What the exchange carries from one step to the next (for checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _meter_ring(ring: Ring, name: str, t: torch.Tensor) -> None:
    """Bytes a ring all-reduce of `t` sends (and receives) per rank."""
    if ring.meter is not None:
        nbytes = 2 * (ring.size - 1) * t.numel() * t.element_size() // ring.size
        ring.meter.add(name, nbytes, nbytes)


def _scatter_parts(parts: list[Selection], sent: torch.Tensor, acc: torch.Tensor, ring: Ring,
                   out: torch.Tensor | None) -> Reduced:
    """Every rank's (index, value) pairs added into a zeroed `out`, in rank order (same bits everywhere)."""
    out = torch.zeros_like(acc) if out is None else out.zero_()
    for p in parts:
        out.index_add_(0, p.indices, p.values)
    return Reduced(out.div_(ring.size), sent)


@EXCHANGES.register("dense")
class Dense(Exchange):
    name = "dense"

    def reduce(self, acc, segments, selector, ring, step, out=None):  # one phase: all-reduce in `out`
        out = acc.clone() if out is None else out.copy_(acc)
        dist.all_reduce(out, group=ring.group)
        _meter_ring(ring, self.name, out)
        return Reduced(out.div_(ring.size), None)


@EXCHANGES.register("allgather")
class AllGather(Exchange):
    name = "allgather"

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


@EXCHANGES.register("gloo-allgather")
class GlooAllGather(Exchange):
    """torch.distributed.all_gather of (index, value) padded to the largest k (GRACE, DGC)."""

    name = "gloo-allgather"

    def combine(self, acc, segments, sel, ring):
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
        parts = []
        for c, m in zip(counts, got):
            p = unpack(m, kmax, acc.dtype)
            parts.append(Selection(p.indices[: int(c)], p.values[: int(c)]))
        return parts, sel.indices

    def write(self, acc, combined, ring, out):
        return _scatter_parts(*combined, acc, ring, out)


class Picked(NamedTuple):
    """shared-index's local half of a step: what `combine` needs."""

    kind: str  # "positions" (a selector that picks the same positions everywhere) or "scores"
    local: torch.Tensor  # the positions, or this rank's block scores of the accumulation
    picked: Optional[tuple[torch.Tensor, torch.Tensor]]  # (positions, blocks) from the last step's scores; None: agree first
    fresh: Optional[torch.Tensor]  # block scores of this step's gradient (None: not known)


@EXCHANGES.register("shared-index")
class SharedIndex(Exchange):
    """One index set for all: the blocks with the largest predicted score, then a dense all-reduce
    of just their values. Entries a worker had outside the set stay in its residual.

    One all-reduce per step: the message is [chosen values | block scores] and the summed scores
    pick the next step's blocks. The pick must be made before the next gradient exists, so the
    score predicts the next accumulation: ||residual after this step||^2 + ||this step's
    gradient||^2 per block (the next gradient taken to be like this one). A block that is the
    largest every step has no residual left once sent, but its gradient keeps it on top, so it is
    sent every step (scoring the residual alone sent it only every other step). The summed score
    is the sum over ranks of each rank's squared block norms, not the squared norm of the sum:
    it ranks blocks by how much all ranks hold there, whatever their signs.
    Scores are kept per tensor (Segment.id), so they survive a change of bucket layout; a step
    with a tensor that has none yet (the first) all-reduces the scores first."""

    name = "shared-index"

    def __init__(self, block: int = 256):
        self.block = block
        self.scores: dict[str, torch.Tensor] = {}  # tensor -> summed residual block scores of the last step

    def prepare(self, acc, segments, selector, step):
        """The local half of the selection: this step's block scores and, from the scores the
        last step summed, the blocks to send (None on a first step: combine agrees first)."""
        if selector.shared_indices:  # the same positions everywhere: no blocks to agree on
            return Picked("positions", select_segments(acc, segments, selector, step).indices, None, None)
        local = self.block_scores([acc[s.offset : s.offset + s.numel] for s in segments])
        grads = [s.grad for s in segments]
        fresh = self.block_scores(grads) if all(g is not None for g in grads) else None
        known = [self.scores.get(s.id) for s in segments]
        if any(sc is None or sc.numel() != -(-s.numel // self.block) for sc, s in zip(known, segments)):
            return Picked("scores", local, None, fresh)
        return Picked("scores", local, self.pick(segments, torch.cat(known) if known else local), fresh)

    def block_scores(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Squared norm of every block of every tensor (the last block of each may be short)."""
        B, scores = self.block, []
        for seg in tensors:
            whole = seg.numel() // B * B  # norms of the full blocks straight from a view, no copy
            scores.append(torch.linalg.vector_norm(seg[:whole].view(-1, B), dim=1).square_())
            if whole < seg.numel():
                scores.append(seg[whole:].square().sum().view(1))
        return torch.cat(scores) if scores else torch.empty(0)

    def pick(self, segments: list[Segment], scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat positions of the chosen blocks' entries and the chosen block numbers (same on every rank)."""
        B = self.block
        picked, blocks, start = [], [], 0
        for s in segments:
            nb = -(-s.numel // B)
            kb = min(nb, -(-s.k // B))
            if kb > 0:
                top = torch.topk(scores[start : start + nb], kb, sorted=False).indices.sort().values
                pos = (top.unsqueeze(1) * B + torch.arange(B)).flatten() + s.offset
                if top[-1] == nb - 1:  # the segment's last block may be short: drop the positions past it
                    pos = pos[: pos.numel() - (nb * B - s.numel)]
                picked.append(pos)
                blocks.append(top + start)
            start += nb
        if not picked:
            return torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)
        return torch.cat(picked), torch.cat(blocks)

    def combine(self, acc, segments, prepared, ring):
        kind, local, picked, fresh = prepared
        if kind == "positions":
            values = acc[local]
            if values.numel() > 0:  # k is the same on every rank, so all skip together
                dist.all_reduce(values, group=ring.group)
                _meter_ring(ring, self.name, values)
            return local, values
        if picked is None:  # first step: agree on the scores first
            first = local.clone()
            dist.all_reduce(first, group=ring.group)
            _meter_ring(ring, self.name, first)
            picked = self.pick(segments, first)
        idx, blocks = picked
        k = idx.numel()
        msg = torch.cat([acc[idx], local])
        msg[k:][blocks] = 0  # what stays behind: the residual's scores ...
        if fresh is not None:
            msg[k:].add_(fresh)  # ... and what the next gradient is expected to add
        if self.value_dtype == torch.float32:
            dist.all_reduce(msg, group=ring.group)
            _meter_ring(ring, self.name, msg)
        else:  # 16 bits on the wire, sums in fp32 (scores clamped to what fp16 holds)
            msg[k:].clamp_(max=torch.finfo(self.value_dtype).max / ring.size)
            ring_allreduce(msg, ring, self.name, wire=self.value_dtype)
        start = k
        for s in segments:  # the next step's scores, per tensor
            nb = -(-s.numel // self.block)
            self.scores[s.id] = msg[start : start + nb]
            start += nb
        return idx, msg[:k]

    def write(self, acc, combined, ring, out):
        idx, values = combined
        out = torch.zeros_like(acc) if out is None else out.zero_()
        out[idx] = values / ring.size
        return Reduced(out, idx)

    def state_dict(self):
        return {"scores": {name: sc.clone() for name, sc in self.scores.items()}}

    def load_state_dict(self, state):
        self.scores = dict(state.get("scores", {}))


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

    def combine(self, acc, segments, sel, ring):
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
