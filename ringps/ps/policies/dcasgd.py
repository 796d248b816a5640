"""`dcasgd` (Zheng et al. 2017): delay compensation, g + lambda * g * g * (w_now - w_pulled), where
w_pulled are the values this server last sent that worker. `--dcasgd-adaptive` is the paper's
DC-ASGD-a: lambda / sqrt(v) per entry, v a running mean of g * g (m = 0.95), which makes the
correction independent of the gradient's scale.

Memory: the policy keeps a copy of the shard per worker (what each worker last pulled), so a
DC-ASGD server holds O(workers x shard), unlike every other policy."""

from __future__ import annotations

from typing import Optional

import torch

from ringps.ps import POLICIES
from ringps.ps.policies.base import Policy, Push


@POLICIES.register("dcasgd")
class DCASGD(Policy):
    # the compensation reads the server's values and the worker's backup, which a worker
    # replaying sufficient factors does not have: its layers travel dense, fp16 or top-k
    replayable = False
    MEAN_SQUARE = 0.95  # DC-ASGD-a's m (Zheng et al. 2017)
    memory_note = "a copy of the shard per worker (the values it last pulled)"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lam = cfg.ps.dcasgd_lambda
        self.adaptive = cfg.ps.dcasgd_adaptive
        self.mean_square: Optional[torch.Tensor] = None  # adaptive: running mean of g * g, per entry
        self.backup: dict[int, torch.Tensor] = {}  # worker -> the values it last pulled

    def sent(self, worker: int, values: torch.Tensor) -> None:
        if worker not in self.backup:
            self.backup[worker] = torch.empty_like(values)
        self.backup[worker].copy_(values)

    def transform(self, push: Push, grad: torch.Tensor) -> torch.Tensor:
        # in place and with one temporary: the server holds the shard's lock meanwhile, and on a
        # 10 M-entry shard every extra pass over it is time all workers wait
        if self.adaptive:
            if self.mean_square is None:
                self.mean_square = grad * grad
            else:
                self.mean_square.mul_(self.MEAN_SQUARE).addcmul_(grad, grad, value=1 - self.MEAN_SQUARE)
        backup = self.backup.get(push.worker)
        if backup is None:
            return grad
        c = torch.sub(push.values, backup).mul_(grad).mul_(grad)
        if self.adaptive:
            c.div_(self.mean_square.sqrt().add_(1e-7))  # lambda / sqrt(v), per entry
        return grad.add_(c, alpha=self.lam)

    def state_dict(self) -> dict:
        return {"mean_square": self.mean_square} if self.mean_square is not None else {}

    def load_state_dict(self, state: dict) -> None:
        self.mean_square = state.get("mean_square", self.mean_square)
