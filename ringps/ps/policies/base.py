"""The policy interface: what a server does with one worker step (a push).

For every push, plain or layered, the server calls under its shard lock, in this order:

    verdict = policy.admit(push)                  # the judge: apply or drop, the gradient's scale
    verdict = policy.weigh(push, verdict)         # the other servers, given the judge's verdict
    policy.apply(server, push, verdict, grad)     # default: one SGD step; BSP: into the round
    policy.hold(server, push)                     # before the reply: SSP's bound, BSP's round

A policy whose verdict depends on the push (`judged`: staleness, value distance) is judged once,
by server 0, and the other servers apply its verdict (weighing their own tensors, for VSGD), so a
worker's step is applied whole or dropped whole on every server. Scales and weights multiply the
gradient before momentum: a weight of 1/4 puts a quarter of the gradient into the momentum
buffer, so the push moves the model a quarter as far in total, not only in its first step.

Adding a policy: one file in this folder with a `@POLICIES.register(name)` class, and its import
line in `__init__.py`; `ps-NAME` is then a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional

import torch

if TYPE_CHECKING:
    from ringps.ps.server import Server


@dataclass
class Push:
    """What a server knows of one worker step when it judges it."""

    worker: int
    step: int  # the worker's own step number
    version: int  # the server version of the values the gradient was computed on
    staleness: int  # versions applied since (the judge's count, with several servers)
    lr: float
    values: torch.Tensor  # the server's current values (read only)
    sample: Optional[torch.Tensor] = None  # the worker's values at the VSGD sample positions
    sample_pos: list = field(default_factory=list)  # those positions, per tensor piece of the shard
    seen_version: int = 0  # the server's version when the push was judged
    extra: Any = None  # what the server keeps with the update (layer mode: the sufficient factors)


@dataclass(frozen=True)
class Verdict:
    apply: bool
    scale: float = 1.0  # multiplies the whole gradient, before momentum (stale-lr: 1 / staleness)
    weights: tuple[float, ...] = ()  # and each tensor piece of the shard (vsgd); () : all 1
    value_staleness: float = 0.0  # mean relative distance over the shard's tensors (vsgd)
    reason: str = ""

    def factors(self, pieces: int) -> list[float]:
        """The factor each tensor piece of the shard is multiplied by."""
        w = self.weights or (1.0,) * pieces
        return [self.scale * x for x in w]

    @property
    def weight(self) -> float:
        """The mean factor, for the records."""
        if not self.apply:
            return 0.0
        w = self.weights or (1.0,)
        return self.scale * sum(w) / len(w)

    def but(self, **changes) -> "Verdict":
        return replace(self, **changes)


class Policy:
    judged = False  # the verdict depends on the push: server 0 judges, the others follow
    replayable = True  # a worker can replay the applied update from sufficient factors (layer mode)
    needs_sample = False  # pushes carry the pulled values at the VSGD sample positions
    uses_threshold = False  # reads --staleness-threshold
    carries_on = True  # the job goes on without a dead worker (False: it ends, BSP)
    fraction = 0.0  # VSGD's sample fraction
    memory_note = ""  # what the policy keeps per worker on a server, beyond the shared pools (`ringps list`)
    DEFAULT_THRESHOLD = 4

    def __init__(self, cfg):
        t = cfg.ps.staleness_threshold
        self.threshold = self.default_threshold(cfg.run.workers) if t is None else t
        self.server_momentum = self.momentum(cfg)

    def momentum(self, cfg) -> float:
        """The servers' SGD momentum (and a layered worker's, which replays their updates).

        Asynchrony itself acts as momentum: with N workers a push is on average N - 1 versions
        stale, which Mitliagkas et al. (2016) show behaves as momentum 1 - 1/N. Stacked on the
        synchronous 0.9 it overshoots (ps-async failed to reach the target in 3 of 5 seeds with
        4 equal workers). The default keeps the combined factor (1 - mu_server)(1 - mu_async)
        equal to synchronous training's 1 - mu: mu_server = 1 - N(1 - mu), at least 0."""
        if cfg.ps.async_momentum is not None:
            return cfg.ps.async_momentum
        return round(max(0.0, 1.0 - cfg.run.workers * (1.0 - cfg.train.momentum)), 12)  # 0.7, not 0.7000000000000001, in summary.json

    def default_threshold(self, workers: int) -> int:
        return self.DEFAULT_THRESHOLD

    def lr_share(self, workers: int) -> float:
        """An asynchronous push is one worker's batch: it moves the model 1/N of a synchronous
        step (the mean of N batches), so a sample teaches as much under every policy."""
        return 1.0 / workers

    # -- the decision ---------------------------------------------------------------------
    def admit(self, push: Push) -> Verdict:
        return self.weigh(push, Verdict(True))

    def weigh(self, push: Push, verdict: Verdict) -> Verdict:
        return verdict

    # -- the update -------------------------------------------------------------------------
    def transform(self, push: Push, grad: torch.Tensor) -> torch.Tensor:
        """Rewrite the gradient before it is scaled and applied (DC-ASGD)."""
        return grad

    def apply(self, server: "Server", push: Push, verdict: Verdict, grad: torch.Tensor) -> None:
        server.update(self.transform(push, grad), verdict, push.lr * self.lr_share(len(server.workers)), push)

    def hold(self, server: "Server", push: Push) -> None:
        """Wait (on the server's condition) before the reply; the default replies at once."""

    @classmethod
    def holds(cls) -> bool:
        """Whether a push may wait for other workers' (BSP's round, SSP's bound): `hold` overridden."""
        return cls.hold is not Policy.hold

    def sent(self, worker: int, values: torch.Tensor) -> None:
        """The server sent `worker` these values (DC-ASGD keeps them)."""

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What the policy learned from past pushes; goes into the server's checkpoint."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
