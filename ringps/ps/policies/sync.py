"""`sync` (BSP): one push per live worker per version; the last of them applies their mean and
every worker's reply waits for it. Identical to DDP's averaged all-reduce followed by SGD."""

from __future__ import annotations

from typing import Optional

import torch

from ringps.errors import WorkerFailed
from ringps.ps import POLICIES
from ringps.ps.policies.base import Policy, Push, Verdict


@POLICIES.register("sync")
class Sync(Policy):
    # a worker replaying sufficient factors would need the mean of N factor products, which the
    # layer mode does not send: BSP's layers travel dense, fp16 or top-k
    replayable = False
    carries_on = False

    def __init__(self, cfg):
        super().__init__(cfg)
        self.sum: Optional[torch.Tensor] = None  # this round's gradients, summed (one shard, not N)
        self.pending: set[int] = set()

    def lr_share(self, workers: int) -> float:
        return 1.0  # the mean of N batches is one synchronous step

    def momentum(self, cfg) -> float:
        return cfg.train.momentum  # one step per round, as DDP: no asynchrony to offset

    def _lost(self, server, version: int) -> None:
        if server.failed:
            w = next(iter(server.failed))
            raise WorkerFailed(f"server rank {server.rank}: synchronous round {version} lost worker rank {w} "
                               f"({server.failed[w]})")

    def apply(self, server, push: Push, verdict: Verdict, grad: torch.Tensor) -> None:
        self._lost(server, push.seen_version)
        if self.sum is None:
            self.sum = torch.zeros_like(grad)
        self.sum.add_(grad)
        self.pending.add(push.worker)
        if self.pending >= server.live:
            server.update(self.sum.div_(len(self.pending)), Verdict(True), push.lr)
            self.sum.zero_()
            self.pending.clear()
            server.shard.cond.notify_all()

    def hold(self, server, push: Push) -> None:
        ok = server.shard.cond.wait_for(lambda: server.shard.version > push.seen_version or server.failed or server.finished,
                                        timeout=server.timeout)
        self._lost(server, push.seen_version)
        if not ok:
            missing = sorted(server.live - self.pending)
            raise WorkerFailed(f"server rank {server.rank}: timed out after {server.timeout:g}s waiting for the pushes "
                               f"of worker ranks {missing} for version {push.seen_version}")
