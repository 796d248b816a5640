"""The baselines a user would otherwise pick: torch DDP, and DDP with PyTorch's own comm hooks.

- `allreduce`: DDP's averaged all-reduce (`default_hooks.allreduce_hook`, what DDP does itself).
- `fp16`: `default_hooks.fp16_compress_hook` (gradients cast to half on the wire).
- `powersgd`: `powerSGD_hook.powerSGD_hook`, unchanged, run through `OrderedHook` so its
  collectives keep one order on every rank (the stock hook crashes gloo with several buckets).

`DDPStrategy` is also the base of strategies that are "DDP plus a hook" (ring-topk, ...): they
override `make_hook()` and nothing else.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

from ringps import trace
from ringps.hooks import OrderedHook, TimedHook
from ringps.strategies.base import STRATEGIES, StepStats, Strategy, WorkerContext


class DDPStrategy(Strategy):
    """Forward, stretch, backward (DDP communicates during it), optimizer step."""

    @property
    def bucket_cap_mb(self) -> float:
        return self.cfg.strategy.bucket_cap_mb

    @property
    def init_sync(self) -> bool:
        """DDP broadcasts rank 0's model when it wraps it (every replica is the same)."""
        return True

    def make_hook(self, ctx: WorkerContext) -> tuple[Any, TimedHook]:
        return ctx.group, TimedHook(default_hooks.allreduce_hook)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx: WorkerContext) -> None:
        super().setup(model, optimizer, ctx)
        dev = [ctx.device.index] if ctx.device.type == "cuda" else None
        self.ddp = DDP(
            model,
            device_ids=dev,
            process_group=ctx.group,
            bucket_cap_mb=self.bucket_cap_mb,
            gradient_as_bucket_view=True,
            init_sync=self.init_sync,
        )
        self.hook_state, self.hook = self.make_hook(ctx)
        self.ddp.register_comm_hook(self.hook_state, self.hook)

    def step(self, batch) -> StepStats:
        loss, t0, t2 = self.forward(self.ddp, batch)
        loss.backward()  # buckets are handed to the hook as they become ready
        t3 = time.perf_counter()
        self.optimizer.step()
        t4 = time.perf_counter()
        after = self.after_step()  # communication after the step (local SGD's model averaging)
        ready = max(self.hook.last_ready, t2)
        compute = (t2 - t0) + (ready - t2) + (t4 - t3)  # the stretch as slept, not as asked for
        self.ctx.stretch.last_compute_s = self.forward_s + (ready - t2)
        extra = self.step_extra()
        tr = trace.get()
        if tr.enabled:  # with forward's spans, these add up to compute_s and exposed_s exactly
            tr.add("backward", "compute", t2, ready)
            tr.add("exposed communication", "comm", ready, t3)
            tr.add("optimizer", "compute", t3, t4)
            if after:
                tr.add("model averaging", "comm", t4, t4 + after)
        return StepStats(
            loss=loss.item(),
            compute_s=compute,
            exposed_s=t3 - ready + after,
            t_ready=self.hook.last_ready_wall or time.time(),
            extra=extra,
        )

    def after_step(self) -> float:
        """Work after the optimizer step; returns its seconds (counted as communication)."""
        return 0.0

    def step_extra(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        self.hook.close()


@STRATEGIES.register("allreduce")
class AllReduce(DDPStrategy):
    """Plain DDP."""


@STRATEGIES.register("fp16")
class FP16(DDPStrategy):
    """DDP with gradients in half precision on the wire."""

    def make_hook(self, ctx: WorkerContext) -> tuple[Any, TimedHook]:
        return ctx.group, TimedHook(default_hooks.fp16_compress_hook)


@STRATEGIES.register("powersgd")
class PowerSGD(DDPStrategy):
    """DDP with PyTorch's PowerSGD hook (Vogels et al. 2019), error feedback and warm start on."""

    def make_hook(self, ctx: WorkerContext) -> tuple[Any, TimedHook]:
        s = self.cfg.strategy
        state = psgd.PowerSGDState(
            process_group=ctx.group,
            matrix_approximation_rank=s.powersgd_rank,
            start_powerSGD_iter=s.powersgd_start_iter,
            random_seed=self.cfg.run.seed,
        )
        return state, OrderedHook(psgd.powerSGD_hook)

    def state_dict(self) -> dict[str, Any]:
        return {"powersgd": self.hook_state.__getstate__()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("powersgd")
        if saved:
            group = self.hook_state.process_group
            self.hook_state.__setstate__(saved)
            self.hook_state.process_group = group
