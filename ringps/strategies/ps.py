"""The parameter-server strategies: ps-NAME for every registered policy NAME (ps-sync, ps-async,
ps-threshold, ps-ssp, ps-stale-lr, ps-dcasgd, ps-vsgd). One class; the policy
(ringps/ps/policies/) is the difference.

Workers are ranks 0..W-1, servers the last S ranks of the job. A worker step: forward, (the
--slowdown stretch), backward into the flat gradient buffer, one push-and-pull round trip to
every server, whose reply values land straight in the model's parameters. Worker 0 evaluates.
With --layer-strategy auto the plan places whole layers on the servers and each layer travels
by its own method as soon as its backward is done (ringps/ps/layered.py, layer_server.py).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch.nn as nn

from ringps import trace
from ringps.comm.probe import broadcast_object, measured_cost_params
from ringps.cost import contention
from ringps.errors import ConfigError
from ringps.ps import POLICIES
from ringps.ps.client import Client
from ringps.ps.layer_server import LayerServer
from ringps.ps.layered import LayeredClient
from ringps.ps.layers import layer_specs
from ringps.ps.layout import Layout, flatten_into, gather
from ringps.ps.server import Server
from ringps.schedule.plan import METHODS, Plan, dense_plan, make_plan
from ringps.schedule.profile import profile_model
from ringps.strategies.base import STRATEGIES, StepStats, Strategy, WorkerContext, loss_of

GOODPUT = 0.95  # TCP payload per configured link bit (tbf shapes whole packets)


class ParameterServer(Strategy):
    """Asynchronous policies share one budget of applied updates (epochs x steps per epoch x
    workers): a fast worker does more than its share, a dead worker's share is done by the others,
    and the LR schedule follows the global count. A dropped push does not count (as a dropped
    gradient does not advance TensorFlow's `global_step`): a policy that drops trains on as many
    updates as one that does not, rather than ending early with fewer."""

    needs_servers = True
    collective_eval = False
    synchronous = False
    budgeted = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.policy_name = cfg.strategy.strategy.removeprefix("ps-")
        self.policy = POLICIES.build(self.policy_name, cfg)
        self._stats: dict[str, Any] = {}
        self.client: Client | None = None
        self.layered: LayeredClient | None = None
        self.layer_mode = cfg.strategy.layer_strategy == "auto"

    @classmethod
    def check(cls, cfg) -> None:
        try:  # the policy's own options (e.g. --vsgd-weight's function name)
            POLICIES.build(cfg.strategy.strategy.removeprefix("ps-"), cfg)
        except ValueError as e:
            raise ConfigError(f"--vsgd-weight {cfg.ps.vsgd_weight}: {e}") from None
        if cfg.train.optimizer != "sgd":
            raise ConfigError(f"--optimizer {cfg.train.optimizer}: the parameter servers run momentum SGD "
                              f"({cfg.strategy.strategy}); use --optimizer sgd")
        if cfg.run.backend == "nccl":
            raise ConfigError(f"--backend nccl: the parameter servers speak gloo's tagged point-to-point on CPU "
                              f"buffers ({cfg.strategy.strategy}); use --backend gloo (or auto, which picks it)")

    def layout(self, model: nn.Module, ctx: WorkerContext, plan: Optional[Plan] = None) -> Layout:
        layout = Layout.of(model, servers=len(ctx.server_ranks))
        if plan is None:
            return layout
        modules = dict(model.named_modules())
        server_of = {}
        for lp in plan.layers:
            for n, _ in modules[lp.name].named_parameters(recurse=False):
                server_of[f"{lp.name}.{n}" if lp.name else n] = lp.server
        return layout.placed(server_of)

    # -- worker side ------------------------------------------------------------------------
    def plan(self, model: nn.Module, ctx: WorkerContext) -> Optional[Plan]:
        """Worker side: measure the links (all workers), then rank 0 alone profiles the model and
        plans while the others wait for its plan (servers included, in `setup`/`serve`).

        Profiling alone and scaling by the job's processes per core predicts the run's step; a
        profile taken by all workers at once missed it by 30-44%, since the server process and the
        kernel's network stack only compete for the cores once training starts."""
        if not self.layer_mode:
            return None
        cost = measured_cost_params(ctx.group)
        if ctx.rank != 0:
            return None
        b = ctx.sample_batch
        # the updates timed on the CPU: the servers' (workers replay them on theirs, the same on CPU)
        prof = profile_model(model, b.inputs.to(ctx.device), b.targets.to(ctx.device), update_device=torch.device("cpu"))
        worker_bps = server_bps = cost.bandwidth
        if self.cfg.run.net:
            rates = self.cfg.run.net_rates(ctx.world_size)
            worker_bps = min(rates[r] for r in ctx.worker_ranks) / 8 * GOODPUT
            server_bps = min(rates[r] for r in ctx.server_ranks) / 8 * GOODPUT
        processes = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
        factor = contention(processes, self.cfg.run.threads) if ctx.device.type == "cpu" else 1.0
        args = (prof, ctx.workers, len(ctx.server_ranks), worker_bps, server_bps, cost)
        # a policy whose update a worker cannot replay from factors (DC-ASGD, BSP) plans without them
        methods = METHODS if self.policy.replayable else tuple(m for m in METHODS if m != "sf")
        plan = make_plan(*args, density=self.cfg.compress.density, contention=factor, methods=methods)
        report = {"contention": factor, "processes": processes, "auto": plan_summary(plan),
                  "off": plan_summary(dense_plan(*args, contention=factor))}
        (ctx.out_dir / "plan.json").write_text(json.dumps(report, indent=1))
        return plan

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx: WorkerContext) -> None:
        super().setup(model, optimizer, ctx)
        plan = self.plan(model, ctx)  # before flattening: profiling resets the grads
        if self.layer_mode:
            plan = broadcast_object(plan)
        layout = self.layout(model, ctx, plan)
        self.values, self.grads = flatten_into(model, layout)
        fraction = self.cfg.ps.vsgd_sample if self.policy.needs_sample else None
        t = self.cfg.train
        if self.layer_mode:
            specs = layer_specs(model, plan, layout, self.cfg.compress.density)
            self.layered = LayeredClient(ctx.rank, ctx.server_ranks, model, specs, layout, self.values, self.grads,
                                         ctx.timeout, self.policy.server_momentum, t.weight_decay,
                                         sample_fraction=fraction,
                                         sample_seed=self.cfg.run.seed)
            self.layered.refresh()
        else:
            self.client = Client(ctx.rank, ctx.server_ranks, layout, self.values, self.grads, ctx.timeout,
                                 sample_fraction=fraction, sample_seed=self.cfg.run.seed)
            self.client.pull()
        self.steps = 0
        self.global_updates = 0
        self.job_finished = False  # the worker that evaluates ended the job at its target
        self.paused_seen = 0.0
        self.budget = self.total_pushes(ctx)

    def total_pushes(self, ctx: WorkerContext) -> int:
        t = self.cfg.train
        return (t.steps or t.epochs * ctx.steps_per_epoch) * ctx.workers

    def progress(self):
        return self.global_updates // self.ctx.workers if self.budgeted else None

    def finished(self) -> bool:
        return self.job_finished or (self.budgeted and self.global_updates >= self.budget)

    def end_at_target(self) -> bool:
        """Only worker 0 evaluates: it tells the servers, and every reply after that tells the
        others to stop after their step (a synchronous round is then waited out no more)."""
        (self.layered or self.client).finish()
        self.job_finished = True
        return True

    def settle(self) -> None:
        if self.layered is not None:
            self.layered.settle()

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Worker 0 evaluates the servers' current model with every other push held at the
        servers (see ps/server.py); its next gradient is then computed on fresh values too."""
        self.settle()
        c = self.layered or self.client
        c.hold()
        try:
            yield
        finally:
            c.release()

    def compute(self, batch, waited=lambda: 0.0) -> tuple[torch.Tensor, float, float]:
        """Forward, --slowdown stretch, backward into the flat gradient buffer. Returns the loss,
        the compute seconds (stretch included, `waited()` for updates excluded) and the wait."""
        w0 = waited()
        t0 = time.perf_counter()
        self.grads.zero_()
        loss = loss_of(self.model, batch, self.ctx.device)
        t1 = time.perf_counter()
        w1 = waited()
        pause = self.ctx.stretch(t1 - t0)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        wait = waited() - w0
        tr = trace.get()
        if tr.enabled:  # layer mode: the forward's waits for updates are communication, not compute
            tr.add("forward", "compute", t0, t1, waited_for_updates_s=w1 - w0)
            if pause:
                tr.add("slowdown", "compute", t1, t2, factor=self.ctx.stretch.factor)
            tr.add("backward", "compute", t2, t3)
        self.ctx.stretch.last_compute_s = (t1 - t0) + (t3 - t2) - wait
        return loss, (t3 - t0) - wait, wait  # the stretch as slept, not as asked for

    def step(self, batch) -> StepStats:
        self.steps += 1
        lr = self.optimizer.param_groups[0]["lr"]
        if self.layered is not None:
            # each layer's forward waits for its own update; each layer leaves when its backward is done
            c = self.layered
            c.begin_step(lr, self.steps)
            loss, compute, waited = self.compute(batch, lambda: c.waited_s)
            self.global_updates, self.job_finished = c.global_updates, c.job_finished
            paused, self.paused_seen = c.paused_s - self.paused_seen, c.paused_s
            return StepStats(loss=loss.item(), compute_s=compute, exposed_s=max(0.0, waited - paused), t_ready=time.time(),
                             paused_s=min(paused, waited), applied=c.last.get("applied", True),
                             extra={"staleness": c.last.get("staleness", 0)})
        loss, compute, _ = self.compute(batch)
        ready = time.time()
        res = self.client.push_pull(lr, self.steps)
        self.global_updates, self.job_finished = res.global_updates, res.finished
        return StepStats(
            loss=loss.item(), compute_s=compute, exposed_s=res.round_trip_s - res.paused_s, wait_s=res.held_s,
            paused_s=res.paused_s,
            payload_sent=res.bytes_sent, payload_recv=res.bytes_recv, t_ready=ready, applied=all(res.applied),
            extra={"staleness": max(res.staleness), "value_staleness": max(res.value_staleness),
                   "weight": min(res.weight)},
        )

    def close(self) -> None:
        if self.layered is not None:
            self.layered.close()
        if self.client is not None:
            self.client.stop()

    # -- server side ----------------------------------------------------------------------
    def serve(self, ctx: WorkerContext, model: nn.Module) -> None:
        plan = broadcast_object(None) if self.layer_mode else None  # the workers' plan
        layout = self.layout(model, ctx, plan)
        index = ctx.server_ranks.index(ctx.rank)
        flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        t = self.cfg.train
        cls, extra = Server, {}
        if plan is not None:
            cls, extra = LayerServer, {"specs": layer_specs(model, plan, layout, self.cfg.compress.density)}
        server = cls.from_config(self.cfg, ctx, layout, self.policy, gather(flat, layout, index),
                                 budget=self.total_pushes(ctx), **extra)
        if t.resume:
            server.load_checkpoint(Path(t.resume))
        server.serve()
        self._stats = {**server.stats(), "policy": self.policy_name}

    def summary(self) -> dict[str, Any]:
        return self._stats

    @classmethod
    def merge_summary(cls, stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The job's figures. A worker step is applied or dropped whole on every server, so the
        counts are server 0's (the judge's); each server's own are under `servers`."""
        servers = sorted((s for s in stats.values() if "pushes_applied" in s), key=lambda s: s["server"])
        if not servers:
            return {}
        first = servers[0]
        weights = ("mean_weight", "min_weight", "pushes_weighted")
        keys = ("pushes_applied", "pushes_dropped", "pushes_refused", "max_applied_staleness", "pushes_per_s",
                "buffer_bytes", "snapshot_copies") + weights
        return {
            **{k: first[k] for k in keys[:4]},
            **{k: first.get(k) for k in weights},  # VSGD weighs each server's tensors apart: server 0's head it
            "staleness_histogram": {int(k): v for k, v in sorted(first["staleness_histogram"].items())},
            "pushes_per_s": {str(s["server"]): s["pushes_per_s"] for s in servers},
            "servers_agree": all((s["pushes_applied"], s["pushes_dropped"]) == (first["pushes_applied"], first["pushes_dropped"])
                                 for s in servers),
            "servers": {str(s["server"]): {k: s[k] for k in keys if k in s} for s in servers},
            "policy": first.get("policy"),
            "staleness_threshold": first.get("staleness_threshold"),
            "server_momentum": first.get("server_momentum"),
        }


def plan_summary(plan: Plan) -> dict[str, Any]:
    return {"predicted": plan.predict(), "layers": [
        {"name": l.name, "kind": l.kind, "params": l.params, "method": l.method, "priority": l.priority,
         "server": l.server, "up_bytes": l.up_bytes, "down_bytes": l.down_bytes} for l in plan.layers]}


class SyncParameterServer(ParameterServer):
    """A policy that does not carry on without a worker (BSP): the job moves in lockstep."""

    synchronous = True
    budgeted = False


for _policy in POLICIES.names():  # ps-NAME for every policy: a new policy file is a new strategy
    STRATEGIES.register(f"ps-{_policy}")(ParameterServer if POLICIES.get(_policy).carries_on else SyncParameterServer)
