"""`ring-topk` (annular updating) and its public peer `topk-allgather`, both as DDP + a comm hook.

ring-topk: per-tensor top-k selection with error feedback (or DGC momentum correction), summed
over the ring with the exchange the cost model picks per bucket (dense where selection does not
pay), small tensors fused into one dense message. The cost model is fed with what this job
measures at set-up: the link latency and bandwidth (an all-reduce probe), the CPU cost of
selection and scatter-adds, each parameter's overlap window and the step's compute from a profile
of the model; a sparse step is priced at its exchange's progress relative to a dense step
(`Exchange.progress`, measured; `--sparse-progress` overrides it for all).

topk-allgather: what GRACE and DGC do: every tensor selected and all-gathered with
torch.distributed.all_gather, padded (`--exchange gloo-allgather`, nothing dense).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from ringps.comm.probe import broadcast_object, measured_cost_params
from ringps.hooks import RingTopkState, TimedHook, ring_topk_hook
from ringps.schedule.profile import profile_model
from ringps.strategies.base import STRATEGIES, WorkerContext
from ringps.strategies.ddp import DDPStrategy


@STRATEGIES.register("ring-topk")
class RingTopk(DDPStrategy):
    exchange_override: str | None = None
    dense_below_override: int | None = None

    def make_state(self, ctx: WorkerContext) -> RingTopkState:
        overrides = {k: v for k, v in (("exchange", self.exchange_override), ("dense_below", self.dense_below_override))
                     if v is not None}
        return RingTopkState.from_config(self.cfg, ctx.steps_per_epoch, ctx.group, ctx.timeout, **overrides)

    def make_hook(self, ctx: WorkerContext) -> tuple[Any, TimedHook]:
        state = self.make_state(ctx).bind(self.model, self.optimizer)
        if state.exchange_name == "auto":
            state.cost = measured_cost_params(ctx.group, device=ctx.device)
            b = ctx.sample_batch
            prof = profile_model(self.model, b.inputs.to(ctx.device), b.targets.to(ctx.device)) if b is not None else None
            # one plan for all ranks: rank 0's profile (taken while every rank profiles, as they will train)
            overlap, state.compute_s = broadcast_object((prof.overlap_s, prof.step_s) if prof else ({}, 0.0), ctx.group)
            by_name = dict(self.model.named_parameters())
            state.overlap = {id(by_name[n]): s for n, s in overlap.items() if n in by_name}
        if self.cfg.compress.memory == "dgc":  # momentum lives in the memory now
            for g in self.optimizer.param_groups:
                g["momentum"] = 0.0
        self._last_payload = 0
        return state, TimedHook(ring_topk_hook)

    @property
    def bucket_cap_mb(self) -> float:
        if self.cfg.strategy.layer_strategy == "auto":
            # layer by layer: buckets of at most 1 MB, so each large layer leaves as soon as its
            # backward is done and gets its own method (dense or sparse) from the cost model
            return min(self.cfg.strategy.bucket_cap_mb, 1.0)
        return self.cfg.strategy.bucket_cap_mb

    def setup(self, model: nn.Module, optimizer, ctx: WorkerContext) -> None:
        self.model = model  # make_hook profiles the bare model before DDP wraps it
        super().setup(model, optimizer, ctx)

    def step_extra(self) -> dict[str, Any]:
        s: RingTopkState = self.hook_state
        total = sum(s.meter.sent.values())
        sent, self._last_payload = total - self._last_payload, total
        return {"density": s.schedule(max(0, s.iteration - 1)), "payload_step": sent}

    def state_dict(self) -> dict[str, Any]:
        return {"ring_topk": self.hook_state.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "ring_topk" in state:
            self.hook_state.load_state_dict(state["ring_topk"])

    def summary(self) -> dict[str, Any]:
        s: RingTopkState = self.hook_state
        return {"exchanges_chosen": dict(s.chosen), "payload_sent": dict(s.meter.sent),
                "cost_params": s.cost.as_dict() if s.cost else None, "compute_s": s.compute_s, "sparse_progress": s.progress,
                "decisions": s.priced()}

    def close(self) -> None:
        self.hook_state.close()


@STRATEGIES.register("topk-allgather")
class TopkAllGather(RingTopk):
    exchange_override = "gloo-allgather"
    dense_below_override = 0
