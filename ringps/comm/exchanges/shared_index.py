"""`shared-index`: the workers agree on one set of blocks and all-reduce only their values."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from ringps.comm.exchanges.base import (
    EXCHANGES,
    Exchange,
    Reduced,
    Segment,
    _meter_ring,
    select_segments,
)
from ringps.comm.ring import ring_allreduce
from ringps.cost import B_VAL, Cost, ring_bytes


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
    # k entries common to all ranks: 85 steps to 90% against allreduce's 55 at 100 Mbit/s and at
    # 1 Gbit/s alike (0.647; docs/RESULTS.md §1)
    progress = 0.65

    @classmethod
    def cost(cls, n, k, N, p, block=256, value_bytes=B_VAL):
        nb = math.ceil(n / block)
        sent = ring_bytes(nb + k, N, value_bytes)  # one all-reduce: the scores ride with the values
        cpu = 3 * n * p.pass_s + nb * p.select_s * 8 + 2 * k * p.scatter_s + ring_bytes(nb + k, N, 1) * p.reduce_s
        return Cost(2 * (N - 1) * p.latency + sent / p.bandwidth, cpu, sent, prep_s=n * p.pass_s)  # the block scores

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
        return torch.cat(scores) if scores else torch.empty(0, device=tensors[0].device if tensors else None)

    def pick(self, segments: list[Segment], scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat positions of the chosen blocks' entries and the chosen block numbers (same on every rank)."""
        B = self.block
        picked, blocks, start = [], [], 0
        for s in segments:
            nb = -(-s.numel // B)
            kb = min(nb, -(-s.k // B))
            if kb > 0:
                top = torch.topk(scores[start : start + nb], kb, sorted=False).indices.sort().values
                pos = (top.unsqueeze(1) * B + torch.arange(B, device=top.device)).flatten() + s.offset
                if top[-1] == nb - 1:  # the segment's last block may be short: drop the positions past it
                    pos = pos[: pos.numel() - (nb * B - s.numel)]
                picked.append(pos)
                blocks.append(top + start)
            start += nb
        if not picked:
            none = torch.empty(0, dtype=torch.long, device=scores.device)
            return none, none
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
