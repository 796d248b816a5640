"""Peers that communicate less often instead of less per step: local SGD and DiLoCo.

- `localsgd`: PyTorch's post-local SGD, unchanged: `post_localSGD_hook` all-reduces gradients
  globally for `--local-warmup-steps`, then not at all (`post_local_gradient_allreduce=False`:
  every worker is its own host here, there is no intra-node group to reduce in), and
  `PeriodicModelAverager` averages the models every `--local-period` steps.
- `diloco` (Douillard et al. 2023): each worker takes `--local-period` (H) steps with the inner
  optimizer (`--optimizer`), then the workers average their pseudo-gradients (the outer model
  minus their own) and an outer Nesterov SGD (`--diloco-outer-lr` 0.7, momentum 0.9: the
  paper's) steps the outer model, which every worker continues from. torchft's DiLoCo needs its
  Lighthouse service and Manager, so this is written here, on one all-reduce per round.
  The paper's inner optimizer is AdamW: run it with `--optimizer adam --lr 0.001`. With SGD and
  momentum 0.9 inside, the outer momentum compounds the inner one and facenet/ORL collapsed to a
  constant prediction in every seed tried (docs/RESULTS.md §1).

Both evaluate the model they would ship: localsgd the average of the replicas, diloco the outer
model (identical on every rank), swapped in for the evaluation only.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from ringps import trace
from ringps.cost import ring_bytes
from ringps.hooks import TimedHook
from ringps.strategies.base import STRATEGIES, StepStats, Strategy, WorkerContext
from ringps.strategies.ddp import DDPStrategy


@contextmanager
def swapped(model: nn.Module, values: list[torch.Tensor]) -> Iterator[None]:
    """`values` in the model's parameters for the duration; the model's own afterwards."""
    own = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, v in zip(model.parameters(), values):
            p.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, v in zip(model.parameters(), own):
                p.copy_(v)


def averaged(model: nn.Module, group) -> list[torch.Tensor]:
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    dist.all_reduce(flat, group=group)
    flat.div_(dist.get_world_size(group))
    return [v.view_as(p) for v, p in zip(torch.split(flat, [p.numel() for p in model.parameters()]), model.parameters())]


@STRATEGIES.register("localsgd")
class LocalSGD(DDPStrategy):
    """DDP with PyTorch's post-local SGD hook and periodic model averager."""

    @property
    def init_sync(self) -> bool:
        return not self.cfg.train.resume  # resumed replicas differ between averages: keep each rank's own

    def make_hook(self, ctx: WorkerContext) -> tuple[Any, TimedHook]:
        s = self.cfg.strategy
        self.averager = PeriodicModelAverager(period=s.local_period, warmup_steps=s.local_warmup_steps,
                                              process_group=ctx.group)
        # after the warm-up no gradient leaves its worker
        state = PostLocalSGDState(process_group=ctx.group, subgroup=None, start_localSGD_iter=s.local_warmup_steps,
                                  post_local_gradient_allreduce=False)
        return state, TimedHook(post_localSGD_hook)

    def after_step(self) -> float:
        t0 = time.perf_counter()
        self.averager.average_parameters(self.model.parameters())
        return time.perf_counter() - t0

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        with swapped(self.model, averaged(self.model, self.ctx.group)):
            yield

    def state_dict(self) -> dict[str, Any]:
        return {"localsgd": {"averager_step": self.averager.step, "hook_iter": self.hook_state.iter}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("localsgd")
        if saved:
            self.averager.step, self.hook_state.iter = saved["averager_step"], saved["hook_iter"]


@STRATEGIES.register("diloco")
class DiLoCo(Strategy):
    """H inner steps alone, then one all-reduce of the pseudo-gradient and an outer Nesterov step."""

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx: WorkerContext) -> None:
        super().setup(model, optimizer, ctx)
        with torch.no_grad():
            for p in (model.parameters() if not self.cfg.train.resume else ()):  # all start from rank 0's model
                dist.broadcast(p, src=dist.get_global_rank(ctx.group, 0) if ctx.group else 0, group=ctx.group)
        self.outer_params = [p.detach().clone() for p in model.parameters()]
        s = self.cfg.strategy
        self.outer = torch.optim.SGD(self.outer_params, lr=s.diloco_outer_lr, momentum=s.diloco_outer_momentum,
                                     nesterov=s.diloco_outer_momentum > 0)
        self.inner_steps = 0
        self.rounds = 0

    def sync(self) -> int:
        """The outer step: average pseudo-gradients, step the outer model, continue from it.
        Returns the bytes this rank sent for it (ring all-reduce)."""
        params = list(self.model.parameters())
        delta = torch.cat([(o - p.detach()).reshape(-1) for o, p in zip(self.outer_params, params)])
        dist.all_reduce(delta, group=self.ctx.group)
        delta.div_(self.ctx.workers)
        for o, d in zip(self.outer_params, torch.split(delta, [p.numel() for p in params])):
            o.grad = d.view_as(o)
        self.outer.step()
        with torch.no_grad():
            for o, p in zip(self.outer_params, params):
                p.copy_(o)
        self.rounds += 1
        n = self.ctx.workers
        return int(ring_bytes(delta.numel(), n, delta.element_size()))

    def step(self, batch) -> StepStats:
        loss, t0, t2 = self.forward(self.model, batch)
        loss.backward()
        tb = time.perf_counter()
        self.optimizer.step()
        t3 = time.perf_counter()
        self.inner_steps += 1
        sent = self.sync() if self.inner_steps % self.cfg.strategy.local_period == 0 else 0
        t4 = time.perf_counter()
        self.ctx.stretch.last_compute_s = self.forward_s + (t3 - t2)
        tr = trace.get()
        if tr.enabled:  # the same spans as DDP's step, the outer step as communication
            tr.add("backward", "compute", t2, tb)
            tr.add("optimizer", "compute", tb, t3)
            if sent:
                tr.add("outer step", "comm", t3, t4, round=self.rounds)
        return StepStats(loss=loss.item(), compute_s=(t2 - t0) + (t3 - t2), exposed_s=t4 - t3,
                         payload_sent=sent, payload_recv=sent, t_ready=time.time() - (t4 - t3),
                         extra={"outer_round": self.rounds})

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        with swapped(self.model, self.outer_params):
            yield

    def state_dict(self) -> dict[str, Any]:
        return {"diloco": {"outer_params": [o.clone() for o in self.outer_params], "outer": self.outer.state_dict(),
                           "inner_steps": self.inner_steps, "rounds": self.rounds}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("diloco")
        if saved:
            with torch.no_grad():
                for o, v in zip(self.outer_params, saved["outer_params"]):
                    o.copy_(v)
            self.outer.load_state_dict(saved["outer"])
            self.inner_steps, self.rounds = saved["inner_steps"], saved["rounds"]

    def summary(self) -> dict[str, Any]:
        return {"outer_rounds": self.rounds, "local_period": self.cfg.strategy.local_period}
