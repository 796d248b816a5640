"""Memories: what a worker keeps of the gradient it did not send, per tensor (keyed by name).

- `ef` (error feedback): acc = residual + g; after selection the residual is acc with the sent
  entries zeroed. Nothing is lost: sum of sent + residual = sum of gradients.
- `dgc` (momentum correction, Lin et al. 2018): u = m*u + g; v = v + u; select from v; zero u
  and v where sent (momentum factor masking). The optimizer then runs without momentum, so a
  tensor that is not selected from (a bucket sent dense, a small tensor) gets its momentum here
  too, as in DGC's own code (dgc/compression.py): the averaged gradient goes through
  u = m*u + avg and u is the update; nothing is masked there, since nothing was selected.
- `none`: no memory (what is not sent is dropped) - for ablations.

A dense exchange of a tensor whose memory holds something (`is_clean` False) flushes it:
`flush_input` says what to all-reduce (ef: residual + g; dgc: [m*u + g, v], so the momentum of
every rank and the velocity left behind both arrive averaged) and `flush_output` turns the
average into the update and clears the memory.

The accumulator works in place: `compensate` returns the memory's own buffer (the residual, or
v), valid until `update`. No 40 MB tensor is allocated per step (fresh pages cost more than the
arithmetic here). `place` lets the caller put a tensor's buffer inside a larger flat one, so a
bucket's accumulators are contiguous. Local gradient clipping (DGC) scales each worker's
gradient to norm <= clip / sqrt(N) first. Every buffer is in `state_dict()`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ringps.compress import MEMORIES


class Memory:
    acc_kind = "residual"  # the buffer selection reads

    def __init__(self, momentum: float = 0.9, clip_norm: float = 0.0, workers: int = 1):
        self.momentum, self.clip_norm, self.workers = momentum, clip_norm, workers
        self.buffers: dict[str, dict[str, torch.Tensor]] = {}
        self.dirty: set[str] = set()  # names whose memory may hold something

    def is_clean(self, name: str) -> bool:
        """True when the memory holds nothing for `name`, so a dense exchange may skip it."""
        return name not in self.dirty

    def _buf(self, name: str, kind: str, like: torch.Tensor) -> torch.Tensor:
        per = self.buffers.setdefault(name, {})
        if kind not in per or per[kind].shape != like.shape:
            per[kind] = torch.zeros_like(like)
        return per[kind]

    def place(self, name: str, view: torch.Tensor) -> torch.Tensor:
        """Make `view` the accumulator of `name`, keeping what it held (e.g. after a resume)."""
        old = self.buffers.get(name, {}).get(self.acc_kind)
        if old is not None and old.shape == view.shape:
            view.copy_(old)
        else:
            view.zero_()
        self.buffers.setdefault(name, {})[self.acc_kind] = view
        return view

    def clip(self, grad: torch.Tensor) -> torch.Tensor:
        if self.clip_norm > 0:
            limit = self.clip_norm / self.workers**0.5
            norm = grad.norm()
            if norm > limit:
                grad = grad * (limit / (norm + 1e-12))
        return grad

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """Fold `grad` in; returns the accumulator to select from (the memory's own buffer)."""
        raise NotImplementedError

    def update(self, name: str, sent: Optional[torch.Tensor]) -> None:
        """Forget what was sent: `sent` are the flat positions that went out (None: all)."""
        raise NotImplementedError

    def rescale(self, name: str, factor: float) -> None:
        """Multiply what is held back (not momentum) by `factor`: the learning rate moved, and the
        memory stays in update units (the hook's to_units_of_lr)."""
        buf = self.buffers.get(name, {}).get(self.acc_kind)
        if buf is not None:
            buf.mul_(factor)

    # -- dense exchanges ----------------------------------------------------------------------
    def dense(self, name: str, avg: torch.Tensor) -> None:
        """After a plain all-reduce of a clean tensor's gradient: turn the average into the
        update, in place (error feedback: it already is)."""

    def flush_input(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """What to all-reduce for a tensor whose memory is not clean (a new tensor)."""
        return self.compensate(name, grad).clone()

    def flush_output(self, name: str, reduced: torch.Tensor, out: torch.Tensor) -> None:
        """The averaged flush into `out`; the memory is clean afterwards."""
        out.copy_(reduced)
        self.update(name, None)

    def _zero(self, name: str, buf: torch.Tensor, sent: Optional[torch.Tensor]) -> None:
        if sent is None:
            buf.zero_()
            self.dirty.discard(name)
        else:
            if sent.numel():
                buf[sent] = 0
            self.dirty.add(name)

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": {n: {k: t.clone() for k, t in b.items()} for n, b in self.buffers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffers = {n: {k: t.clone() for k, t in b.items()} for n, b in state["buffers"].items()}
        self.dirty = {n for n, b in self.buffers.items() if any(t.any() for t in b.values())}


@MEMORIES.register("ef")
class ErrorFeedback(Memory):
    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        return self._buf(name, "residual", grad).add_(self.clip(grad))

    def update(self, name: str, sent: Optional[torch.Tensor]) -> None:
        self._zero(name, self.buffers[name]["residual"], sent)


@MEMORIES.register("dgc")
class MomentumCorrection(Memory):
    acc_kind = "v"

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.local: set[str] = set()  # names whose u is this rank's own (after a sparse step)

    def is_clean(self, name: str) -> bool:
        # a plain all-reduce then momentum is exact when u is the same on every rank and no
        # velocity waits to be sent
        return name not in self.dirty and name not in self.local

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        u = self._buf(name, "u", grad)
        u.mul_(self.momentum).add_(self.clip(grad))
        self.local.add(name)
        return self._buf(name, "v", grad).add_(u)

    def update(self, name: str, sent: Optional[torch.Tensor]) -> None:
        self._zero(name, self.buffers[name]["u"], sent)
        self._zero(name, self.buffers[name]["v"], sent)

    def dense(self, name: str, avg: torch.Tensor) -> None:
        u = self._buf(name, "u", avg)
        u.mul_(self.momentum).add_(self.clip(avg))
        avg.copy_(u)

    def flush_input(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        u = self._buf(name, "u", grad)
        v = self._buf(name, "v", grad)
        return torch.cat([torch.add(self.clip(grad), u, alpha=self.momentum), v])

    def flush_output(self, name: str, reduced: torch.Tensor, out: torch.Tensor) -> None:
        n = out.numel()
        u = self.buffers[name]["u"]
        u.copy_(reduced[:n].view_as(u))  # the averaged momentum: the same on every rank from now on
        out.copy_(reduced[:n].view_as(out)).add_(reduced[n:].view_as(out))
        self.buffers[name]["v"].zero_()
        self.dirty.discard(name)
        self.local.discard(name)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "local": sorted(self.local)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.local = set(state.get("local", []))


@MEMORIES.register("none")
class NoMemory(Memory):
    def is_clean(self, name: str) -> bool:
        return True

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        return self._buf(name, "residual", grad).copy_(self.clip(grad))

    def update(self, name: str, sent: Optional[torch.Tensor]) -> None:
        pass
