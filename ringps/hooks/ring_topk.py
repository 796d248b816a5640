"""Annular updating as a plain DDP communication hook: top-k selection with memory, summed on a ring.

    from ringps.hooks import RingTopkState, ring_topk_hook
    ddp.register_comm_hook(RingTopkState(density=0.01), ring_topk_hook)

Per bucket, on one communication thread (so every rank issues the same collectives in the same
order, and the backward pass goes on meanwhile):
  - large tensors: compensate with the memory, select k = density * numel entries per tensor,
    sum the selections over the ring with the bucket's exchange, keep the rest in the memory;
  - small tensors (biases, small conv kernels): deferred, and all-reduced dense in one fused
    message with the last bucket (one latency per step instead of one per tensor).
The exchange is the cost model's choice per bucket ("auto"), or forced (`exchange=`). Every rank
applies the same averaged update, so replicas stay bitwise identical.
"""

from __future__ import annotations

import zlib
from typing import Any, Optional

import torch
import torch.distributed as dist

from ringps.comm.meter import PayloadMeter
from ringps.comm.p2p import Ring
from ringps.comm.sparse import EXCHANGES, VALUE_DTYPES, Exchange, Segment, build_exchange
from ringps.comm.thread import CommThread
from ringps.compress import MEMORIES, SELECTORS, DensitySchedule
from ringps.config import SPARSE_PROGRESS
from ringps.cost import CostParams, choose_exchange


class RingTopkState:
    """Hyper-parameters, per-tensor memory (keyed by parameter name) and statistics."""

    def __init__(
        self,
        density: float = 0.01,
        process_group: Optional[dist.ProcessGroup] = None,
        warmup_steps: int = 0,
        selector: str = "auto",
        memory: str = "ef",
        exchange: str = "auto",
        dense_below: int = 1 << 17,
        block: int = 256,
        momentum: float = 0.9,
        clip_norm: float = 0.0,
        seed: int = 0,
        timeout: float = 300.0,
        cost: Optional[CostParams] = None,
        progress: float = SPARSE_PROGRESS,
        compute_s: float = 0.0,
        value_dtype: str = "fp32",
    ):
        if not 0.0 <= density <= 1.0:
            raise ValueError(f"density {density}: must be in [0, 1]")
        if not 0.0 < progress <= 1.0:
            raise ValueError(f"progress {progress}: must be in (0, 1]")
        if exchange != "auto":
            EXCHANGES.get(exchange)
        if value_dtype not in VALUE_DTYPES:
            raise ValueError(f"value_dtype {value_dtype!r}: one of {', '.join(VALUE_DTYPES)}")
        self.value_dtype = value_dtype
        # hyper-parameters
        self.process_group = process_group
        self.schedule = DensitySchedule(density, warmup_steps)
        self.exchange_name, self.dense_below, self.block = exchange, dense_below, block
        self.timeout, self.seed = timeout, seed
        self.selector = SELECTORS.build(selector, seed=seed) if selector in ("threshold", "randomk", "auto") else SELECTORS.build(selector)
        self.memory = MEMORIES.build(memory, momentum=momentum, clip_norm=clip_norm,
                                     workers=dist.get_world_size(process_group) if dist.is_initialized() else 1)
        self.cost = cost or CostParams()
        # auto's price of sparse updates: the progress a sparse step makes relative to a dense
        # one, and the step's compute (seconds; its share per bucket goes into the comparison)
        self.progress, self.compute_s = progress, compute_s
        self.model_numel = 0
        # internal state
        self.iteration = 0
        self.names: dict[int, str] = {}  # id(param) -> name, for memory keys and checkpoints
        self.overlap: dict[int, float] = {}  # id(param) -> backward seconds left once its grad is ready
        self.plans: dict[tuple, str] = {}  # (bucket signature, k) -> exchange name
        self.exchanges: dict[str, Exchange] = {}  # name -> the exchange (state kept per tensor, e.g. block scores)
        self.deferred: list[tuple[torch.futures.Future, torch.Tensor, list[torch.Tensor]]] = []
        self._flat: dict[tuple, tuple[torch.Tensor, Optional[torch.Tensor]]] = {}
        self._ring: Optional[Ring] = None
        self._thread: Optional[CommThread] = None
        # statistics
        self.meter = PayloadMeter()
        self.chosen: dict[str, int] = {}

    # -- set-up --------------------------------------------------------------------------
    def bind(self, model: torch.nn.Module) -> "RingTopkState":
        """Key memories by parameter name (stable across DDP's bucket rebuild and checkpoints)."""
        self.names = {id(p): n for n, p in model.named_parameters()}
        self.model_numel = sum(p.numel() for p in model.parameters())
        return self

    @property
    def ring(self) -> Ring:
        if self._ring is None:
            self._ring = Ring(self.process_group, self.timeout, self.meter)
        return self._ring

    @property
    def thread(self) -> CommThread:
        if self._thread is None:
            self._thread = CommThread()
        return self._thread

    def close(self) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None

    # -- checkpoints ---------------------------------------------------------------------
    def _generator(self) -> Optional[torch.Generator]:
        """The selector's sampling generator, if it has one (threshold, or auto's threshold)."""
        return getattr(getattr(self.selector, "threshold", self.selector), "gen", None)

    def state_dict(self) -> dict[str, Any]:
        gen = self._generator()
        return {"iteration": self.iteration, "memory": self.memory.state_dict(),
                "selector_rng": gen.get_state() if gen is not None else None,
                "exchanges": {name: ex.state_dict() for name, ex in self.exchanges.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iteration = state["iteration"]
        self.memory.load_state_dict(state["memory"])
        self._flat.clear()  # re-place the loaded buffers into fresh flat accumulators
        self.exchanges.clear()
        for name, saved in state.get("exchanges", {}).items():
            self.exchange(name).load_state_dict(saved)
        gen = self._generator()
        if gen is not None and state.get("selector_rng") is not None:
            gen.set_state(state["selector_rng"])

    # -- the work of one bucket (runs on the communication thread) ------------------------
    def plan(self, segments: list[Segment], overlap_s: float) -> str:
        if self.exchange_name != "auto":
            return self.exchange_name
        n, k = sum(s.numel for s in segments), sum(s.k for s in segments)
        key = (tuple(s.numel for s in segments), k)
        if key not in self.plans:
            share = self.compute_s * n / self.model_numel if self.model_numel else 0.0
            self.plans[key] = choose_exchange(n, k, self.ring.size, self.cost, overlap_s, block=self.block,
                                              compute_s=share, progress=self.progress,
                                              value_bytes=VALUE_DTYPES[self.value_dtype].itemsize)[0]
        return self.plans[key]

    def exchange(self, name: str) -> Exchange:
        """The exchange `name`, kept across steps (shared-index carries block scores per tensor)."""
        if name not in self.exchanges:
            self.exchanges[name] = build_exchange(name, self.block, self.value_dtype)
        return self.exchanges[name]

    def buffers(self, index: int, names: list[str], large: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket's flat accumulator (the memories' buffers, contiguous) and its output
        buffer, made once per bucket layout and reused every step."""
        key = (index, tuple(names))
        if key not in self._flat:
            n = sum(g.numel() for g in large)
            acc = torch.empty(n, dtype=large[0].dtype, device=large[0].device)
            offset = 0
            for name, g in zip(names, large):
                self.memory.place(name, acc[offset : offset + g.numel()])
                offset += g.numel()
            out = torch.empty_like(acc) if len(large) > 1 else None  # one tensor: write into its grad
            self._flat[key] = (acc, out)
        return self._flat[key]

    def name_of(self, index: int, i: int, p: torch.Tensor) -> str:
        return self.names.get(id(p), f"bucket{index}.{i}")

    def process(self, index: int, buffer: torch.Tensor, grads: list[torch.Tensor], params: list[torch.Tensor],
                step: int) -> list[tuple[str, torch.Tensor]]:
        """Reduce the bucket's large tensors in place; return its small ones, named (deferred)."""
        named = [(self.name_of(index, i, p), g) for i, (g, p) in enumerate(zip(grads, params))]
        large = [(n, g) for n, g in named if g.numel() >= self.dense_below]
        small = [(n, g) for n, g in named if g.numel() < self.dense_below]
        if not large:
            return small
        names = [n for n, _ in large]
        segments, offset = [], 0
        for tname, g in large:
            # the key seeds randomk's positions: from the name, so it survives DDP's bucket rebuild
            segments.append(Segment(offset, g.numel(), self.schedule.k(g.numel(), step), zlib.crc32(tname.encode()), tname,
                                    g.view(-1)))
            offset += g.numel()
        overlap = min(self.overlap.get(id(p), 0.0) for g, p in zip(grads, params) if g.numel() >= self.dense_below)
        name = self.plan(segments, overlap)
        self.chosen[name] = self.chosen.get(name, 0) + 1
        if name == "dense":
            return self.dense_bucket(buffer, named, large, small)
        acc, out = self.buffers(index, names, [g for _, g in large])
        for tname, g in large:
            self.memory.compensate(tname, g.view(-1))  # accumulates into acc in place
        dest = out if out is not None else large[0][1].view(-1)
        sent = self.exchange(name).reduce(acc, segments, self.selector, self.ring, step, dest).sent
        for seg, (tname, g) in zip(segments, large):
            if out is not None:
                g.view(-1).copy_(out[seg.offset : seg.offset + seg.numel])
            if sent is None:
                self.memory.update(tname, None)
            else:
                lo, hi = torch.searchsorted(sent, torch.tensor([seg.offset, seg.offset + seg.numel])).tolist()
                self.memory.update(tname, sent[lo:hi] - seg.offset)
        return small

    def dense_bucket(self, buffer: torch.Tensor, named: list, large: list, small: list) -> list[tuple[str, torch.Tensor]]:
        """The bucket all-reduced dense. With nothing held back in the memory this is exactly DDP's
        all-reduce of the whole bucket, small tensors too; a memory that holds something is
        flushed with it (error feedback's residual, DGC's velocity and local momentum). Then the
        memory makes the update of every tensor (DGC: momentum on the average)."""
        n = self.ring.size
        if all(self.memory.is_clean(t) for t, _ in large):
            dist.all_reduce(buffer, group=self.process_group)
            self.meter.add("dense", buffer.numel() * buffer.element_size() * 2 * (n - 1) // n)
            buffer.div_(n)
            for tname, g in named:
                self.memory.dense(tname, g.view(-1))
            return []
        parts = [self.memory.flush_input(t, g.view(-1)) for t, g in large]
        msg = torch.cat(parts)
        dist.all_reduce(msg, group=self.process_group)
        self.meter.add("dense", msg.numel() * msg.element_size() * 2 * (n - 1) // n)
        msg.div_(n)
        at = 0
        for (tname, g), part in zip(large, parts):
            self.memory.flush_output(tname, msg[at : at + part.numel()], g.view(-1))
            at += part.numel()
        return small

    def reduce_small(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """One dense all-reduce for every deferred small tensor of the step."""
        if not tensors:
            return
        flat = torch.cat([t.flatten() for _, t in tensors])
        dist.all_reduce(flat, group=self.process_group)
        n = self.ring.size
        self.meter.add("dense-small", flat.numel() * flat.element_size() * 2 * (n - 1) // n)
        flat.div_(n)
        offset = 0
        for name, t in tensors:
            part = flat[offset : offset + t.numel()]
            self.memory.dense(name, part)
            t.copy_(part.view_as(t))
            offset += t.numel()


def ring_topk_hook(state, bucket):
    """DDP communication hook (state: RingTopkState). No annotations on purpose: DDP compares
    them to its own classes, and this module's postponed annotations would be strings."""
    fut: torch.futures.Future = torch.futures.Future()
    buffer, grads, params = bucket.buffer(), bucket.gradients(), bucket.parameters()
    index, last, step = bucket.index(), bucket.is_last(), state.iteration

    def work() -> None:
        try:
            small = state.process(index, buffer, grads, params, step)
            if small:
                state.deferred.append((fut, buffer, small))
            else:
                fut.set_result(buffer)
            if last:
                pending, state.deferred = state.deferred, []
                state.reduce_small([t for _, _, ts in pending for t in ts])
                state.iteration += 1
                for f, buf, _ in pending:
                    f.set_result(buf)
        except BaseException as e:  # noqa: BLE001 - DDP re-raises it from backward()
            pending, state.deferred = state.deferred, []
            for f, _, _ in pending:
                if not f.done():
                    f.set_exception(e)
            if not fut.done():
                fut.set_exception(e)

    state.thread.submit(work)
    return fut
