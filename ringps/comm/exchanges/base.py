"""The exchange interface, shared helpers, and the auto-selection that prices every registered
exchange with its own `cost` (one file per exchange in this folder, one import line in
`__init__.py`: that is all an exchange needs).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Optional

import torch

from ringps import trace
from ringps.comm.p2p import Ring
from ringps.compress.selectors import Selection, Selector
from ringps.cost import B_VAL, Cost, CostParams, ring_bytes
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
    ex.value_dtype = ex.fixed_dtype or VALUE_DTYPES[value_dtype]
    return ex


def select_segments(acc: torch.Tensor, segments: list[Segment], selector: Selector, step: int) -> Selection:
    idx, val = [], []
    for s in segments:
        sel = selector.select(acc[s.offset : s.offset + s.numel], s.k, step, s.key)
        idx.append(sel.indices + s.offset)
        val.append(sel.values)
    if not idx:
        return Selection(torch.empty(0, dtype=torch.long, device=acc.device), acc.new_empty(0))
    return Selection(torch.cat(idx), torch.cat(val))


def pack(sel: Selection) -> torch.Tensor:
    """(index, value) pairs as one byte message: k int32 indices, then k values."""
    return torch.cat([sel.indices.to(IDX).view(torch.uint8), sel.values.contiguous().view(torch.uint8)])


def unpack(msg: torch.Tensor, k: int, dtype: torch.dtype) -> Selection:
    ib = k * IDX.itemsize
    return Selection(msg[:ib].view(IDX).long(), msg[ib:].view(dtype))

class Exchange:
    name = ""
    auto = True  # a candidate of exchange="auto"
    # progress of a step through this exchange relative to a dense step (steps to the target, dense
    # / this), measured: what its update carries decides it, not the bytes (docs/RESULTS.md §1)
    progress = 1.0
    value_dtype = torch.float32  # what values travel in (sums stay fp32)
    fixed_dtype: Optional[torch.dtype] = None  # what values travel in whatever --value-dtype says
    whole = False  # True: no selection, the whole bucket is all-reduced (by the hook, small tensors too)
    lossy = False  # True: rounds what a full selection would send exactly (auto leaves it out at density 1)

    @classmethod
    def wire_bytes(cls, value_bytes: int) -> int:
        """Bytes per value on the wire when --value-dtype gives `value_bytes`."""
        return cls.fixed_dtype.itemsize if cls.fixed_dtype is not None else value_bytes

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

    @classmethod
    def cost(cls, n: int, k: int, N: int, p: CostParams, block: int = 256, value_bytes: int = B_VAL) -> Cost:
        """What summing a bucket of n entries with k selected per worker over N workers costs:
        wire time (can hide behind the backward pass), CPU time, bytes sent per worker, and the
        part of the CPU before the first message (`prep_s`: the simulator starts the wire after it)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What the exchange carries from one step to the next (for checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _meter_ring(ring: Ring, name: str, t: torch.Tensor) -> None:
    """Bytes a ring all-reduce of `t` sends (and receives) per rank."""
    if ring.meter is not None:
        nbytes = int(ring_bytes(t.numel(), ring.size, t.element_size()))
        ring.meter.add(name, nbytes, nbytes)


def _scatter_parts(parts: list[Selection], sent: torch.Tensor, acc: torch.Tensor, ring: Ring,
                   out: torch.Tensor | None) -> Reduced:
    """Every rank's (index, value) pairs added into a zeroed `out`, in rank order (same bits everywhere)."""
    out = torch.zeros_like(acc) if out is None else out.zero_()
    for p in parts:
        out.index_add_(0, p.indices, p.values)
    return Reduced(out.div_(ring.size), sent)


def price(name: str, n: int, k: int, N: int, p: CostParams, block: int = 256, value_bytes: int = B_VAL) -> Cost:
    """The registered exchange `name`'s cost (nothing to send with one worker)."""
    return Cost(0.0, 0.0, 0.0) if N <= 1 else EXCHANGES.get(name).cost(n, k, N, p, block, value_bytes)


def progress_of(name: str, override: Optional[float] = None) -> float:
    """A step through exchange `name` against a dense step: its own measured `progress`, or
    `override` (--sparse-progress) for every sparse exchange."""
    ex = EXCHANGES.get(name)
    return ex.progress if override is None or ex.whole else override


def auto_candidates() -> tuple[str, ...]:
    """The registered exchanges exchange="auto" weighs."""
    return tuple(n for n in EXCHANGES.names() if EXCHANGES.get(n).auto)


def tail_start(total_steps: Optional[int], exact_tail: float) -> Optional[int]:
    """The first step of ring-topk's exact tail, its last `exact_tail` of `total_steps` (None: the
    run's length unknown, or no tail)."""
    return int(total_steps * (1.0 - exact_tail)) if total_steps and exact_tail > 0 else None


def faithful_candidates() -> tuple[str, ...]:
    """The exchanges auto may choose in ring-topk's exact tail: whole-bucket ones and the sparse
    ones whose update carries as much as any sparse one's (the highest progress: every rank's own
    top k)."""
    sparse = [EXCHANGES.get(c).progress for c in auto_candidates() if not EXCHANGES.get(c).whole]
    best = max(sparse, default=1.0)
    return tuple(c for c in auto_candidates() if EXCHANGES.get(c).whole or EXCHANGES.get(c).progress >= best)


def choose_exchange(n: int, k: int, N: int, p: CostParams, overlap_s: float = 0.0,
                    candidates: Optional[tuple[str, ...]] = None, block: int = 256,
                    compute_s: float = 0.0, progress: Optional[float] = None,
                    value_bytes: int = B_VAL) -> tuple[str, dict[str, float]]:
    """The exchange with the shortest step per unit of progress, and every candidate's predicted
    cost (exposed seconds per step).

    A sparse step makes less progress than a dense one, and how much less depends on what the
    exchange's update carries (shared-index: k entries common to all ranks; allgather and
    sparse-rs: every rank's own k). With `compute_s` (the compute this bucket's share of the step
    costs) each candidate c is weighed as (compute + cost_c) / progress_c, its own `progress` or,
    where given, `progress` for every sparse one. Where priced alike, a whole-bucket exchange wins,
    then the cheaper."""
    names = candidates or auto_candidates()
    if k >= n:  # density 1: nothing is to be compressed, so nothing is rounded either (plain DDP)
        names = tuple(c for c in names if not EXCHANGES.get(c).lossy) or names
    costs = {c: price(c, n, k, N, p, block, value_bytes).exposed(overlap_s, p.cpu_share) for c in names}

    def per_progress(c: str) -> tuple[float, bool, float]:
        return (compute_s + costs[c]) / progress_of(c, progress), not EXCHANGES.get(c).whole, costs[c]

    return min(costs, key=per_progress), costs
