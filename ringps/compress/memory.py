"""Memories: what a worker keeps of the gradient it did not send, per tensor (keyed by name).

- `ef` (error feedback): acc = residual + g; after selection the residual is acc with the sent
  entries zeroed. Nothing is lost: sum of sent + residual = sum of gradients.
- `dgc` (momentum correction, Lin et al. 2018): u = m*u + g; v = v + u; select from v; zero u
  and v where sent (momentum factor masking). The optimizer then runs without momentum.
- `none`: no memory (what is not sent is dropped) - for ablations.

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

    def is_clean(self, name: str) -> bool:
        return False  # the momentum u lives here: every step must go through it

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        u = self._buf(name, "u", grad)
        u.mul_(self.momentum).add_(self.clip(grad))
        return self._buf(name, "v", grad).add_(u)

    def update(self, name: str, sent: Optional[torch.Tensor]) -> None:
        self._zero(name, self.buffers[name]["u"], sent)
        self._zero(name, self.buffers[name]["v"], sent)


@MEMORIES.register("none")
class NoMemory(Memory):
    def is_clean(self, name: str) -> bool:
        return True

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        return self._buf(name, "residual", grad).copy_(self.clip(grad))

    def update(self, name: str, sent: Optional[torch.Tensor]) -> None:
        pass
