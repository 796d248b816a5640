"""Memories: what a worker keeps of the gradient it did not send, per tensor (keyed by name).

- `ef` (error feedback): acc = residual + g; after selection the residual is acc with the sent
  entries zeroed. Nothing is lost: sum of sent + residual = sum of gradients.
- `dgc` (momentum correction, Lin et al. 2018): u = m*u + g; v = v + u; select from v; zero u
  and v where sent (momentum factor masking). The optimizer then runs without momentum.
- `none`: no memory (what is not sent is dropped) - for ablations.

Local gradient clipping (DGC) scales each worker's gradient to norm <= clip / sqrt(N) before it
enters the memory. Every buffer is in `state_dict()`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ringps.compress import MEMORIES


class Memory:
    def __init__(self, momentum: float = 0.9, clip_norm: float = 0.0, workers: int = 1):
        self.momentum, self.clip_norm, self.workers = momentum, clip_norm, workers
        self.buffers: dict[str, dict[str, torch.Tensor]] = {}

    def _buf(self, name: str, kind: str, like: torch.Tensor) -> torch.Tensor:
        per = self.buffers.setdefault(name, {})
        if kind not in per or per[kind].shape != like.shape:
            per[kind] = torch.zeros_like(like)
        return per[kind]

    def clip(self, grad: torch.Tensor) -> torch.Tensor:
        if self.clip_norm > 0:
            limit = self.clip_norm / self.workers**0.5
            norm = grad.norm()
            if norm > limit:
                grad = grad * (limit / (norm + 1e-12))
        return grad

    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """The accumulated gradient to select from (a new tensor; `grad` is not modified)."""
        raise NotImplementedError

    def update(self, name: str, acc: torch.Tensor, sent: Optional[torch.Tensor]) -> None:
        """Keep what was not sent; `sent` are the flat indices that went out (None: all)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": {n: {k: t.clone() for k, t in b.items()} for n, b in self.buffers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffers = {n: {k: t.clone() for k, t in b.items()} for n, b in state["buffers"].items()}


@MEMORIES.register("ef")
class ErrorFeedback(Memory):
    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        return self._buf(name, "residual", grad) + self.clip(grad)

    def update(self, name: str, acc: torch.Tensor, sent: Optional[torch.Tensor]) -> None:
        residual = self._buf(name, "residual", acc)
        if sent is None:
            residual.zero_()
        else:
            residual.copy_(acc)
            residual[sent] = 0


@MEMORIES.register("dgc")
class MomentumCorrection(Memory):
    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        u = self._buf(name, "u", grad)
        v = self._buf(name, "v", grad)
        u.mul_(self.momentum).add_(self.clip(grad))
        v.add_(u)
        return v.clone()

    def update(self, name: str, acc: torch.Tensor, sent: Optional[torch.Tensor]) -> None:
        for kind in ("u", "v"):
            buf = self.buffers[name][kind]
            if sent is None:
                buf.zero_()
            else:
                buf[sent] = 0


@MEMORIES.register("none")
class NoMemory(Memory):
    def compensate(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        return self.clip(grad).clone()

    def update(self, name: str, acc: torch.Tensor, sent: Optional[torch.Tensor]) -> None:
        pass
