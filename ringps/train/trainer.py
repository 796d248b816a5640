"""The training loop every strategy shares: epochs or steps, LR schedule, evaluation, metrics,
checkpoints. Read it top to bottom; strategies do the rest through `strategy.step(batch)`.

Time: `t` in every row is seconds of training since the common start, with evaluation pauses
taken out, so evaluating more often does not change time-to-accuracy.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Optional

import torch

from ringps import trace
from ringps.comm.meter import TcpCounters, host_kernel_cpu
from ringps.data import Dataset
from ringps.data.loader import ShardedLoader
from ringps.record import Recorder
from ringps.strategies.base import Strategy, WorkerContext
from ringps.train import checkpoint
from ringps.train.evaluate import evaluate


def build_optimizer(params, cfg) -> torch.optim.Optimizer:
    t = cfg.train
    if t.optimizer == "adam":
        return torch.optim.Adam(params, lr=t.lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)


def lr_factor(step: int, total: int, warmup: int, kind: str) -> float:
    """Multiplier of the peak learning rate at `step` (linear warm-up, then the schedule)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return 0.1 ** int(progress / 0.34)  # "step": x0.1 at one and two thirds


class Clock:
    """Training seconds since start, evaluation excluded."""

    def __init__(self, offset: float = 0.0):
        self.start = time.perf_counter() - offset
        self._paused_at: Optional[float] = None

    def now(self) -> float:
        return (self._paused_at or time.perf_counter()) - self.start

    def pause(self) -> None:
        self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            self.start += time.perf_counter() - self._paused_at
            self._paused_at = None

    def skip(self, seconds: float) -> None:
        """Leave out `seconds` that just passed (e.g. waiting for another worker's evaluation)."""
        self.start += max(0.0, seconds)


class StepProfiler:
    """--profile-steps A:B: torch.profiler around steps A to B, exported beside the rank's trace."""

    def __init__(self, spec: Optional[str], out_dir, rank: int):
        self.first, self.last = (int(x) for x in spec.split(":")) if spec else (0, -1)
        self.path = out_dir / "trace" / f"profile-rank-{rank}.json"
        self.prof = None

    def before(self, step: int) -> None:
        if step == self.first:
            self.prof = torch.profiler.profile(record_shapes=True)
            self.prof.__enter__()

    def after(self, step: int) -> None:
        if self.prof is not None and step == self.last:
            self.prof.__exit__(None, None, None)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.prof.export_chrome_trace(str(self.path))
            self.prof = None


@dataclass
class TrainResult:
    steps: int
    final_accuracy: Optional[float]
    time_to_accuracy_s: Optional[float]


class Trainer:
    def __init__(self, cfg, ctx: WorkerContext, strategy: Strategy, data: Dataset, model: torch.nn.Module):
        self.cfg, self.ctx, self.strategy, self.data, self.model = cfg, ctx, strategy, data, model
        self.loader = ShardedLoader(
            data.train, ctx.worker, ctx.workers, cfg.data.batch_size, cfg.run.seed,
            augment=cfg.data.augment and data.augment,
        )
        self.stats = (self.loader.mean, self.loader.std)
        t = cfg.train
        self.total_steps = t.steps or t.epochs * len(self.loader)
        self.eval_every = t.eval_every or len(self.loader)
        self.warmup = int(round(t.warmup_epochs * len(self.loader)))
        self.optimizer = build_optimizer(model.parameters(), cfg)
        self.recorder = Recorder(ctx.out_dir, ctx.rank)
        self.tcp = TcpCounters()
        self.step = 0
        self.where = "setup"  # for error messages: setup, step N, evaluation after step N
        self.clock_offset = 0.0
        self.reached_at: Optional[float] = None
        self.last_accuracy: Optional[float] = None

    # -- checkpoints ---------------------------------------------------------------------
    def state_dict(self, t: float) -> dict:
        return {
            "step": self.step, "t": t, "reached_at": self.reached_at,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "strategy": self.strategy.state_dict(), "rng": torch.get_rng_state(),
        }

    def load(self, path: str) -> dict:
        """Model, optimizer and loop position; the strategy's own state loads after its setup."""
        state = checkpoint.load(path, self.ctx.rank)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.clock_offset, self.reached_at = state["step"], state["t"], state["reached_at"]
        torch.set_rng_state(state["rng"])  # dropout continues exactly where it stopped
        return state["strategy"]

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> TrainResult:
        cfg, ctx = self.cfg, self.ctx
        resumed = None
        if cfg.train.resume and not (self.strategy.needs_servers and not checkpoint.exists(cfg.train.resume, ctx.rank)):
            resumed = self.load(cfg.train.resume)  # (a ps worker without a checkpoint just pulls the servers' state)
        ctx.steps_per_epoch = len(self.loader)
        ctx.sample_batch = next(iter(self.loader.epoch(0)))
        self.strategy.setup(self.model, self.optimizer, ctx)
        if resumed is not None:
            self.strategy.load_state_dict(resumed)
        evaluator = self.strategy.collective_eval or ctx.worker == 0
        peak = cfg.train.lr
        self.recorder.write("start", worker=ctx.worker, rank=ctx.rank, pid=os.getpid(), steps=self.total_steps,
                            steps_per_epoch=len(self.loader), wall=time.time())
        clock = Clock(self.clock_offset)
        tracer, profiler = trace.get(), StepProfiler(cfg.run.profile_steps, ctx.out_dir, ctx.rank)
        stop = False
        budgeted = self.strategy.budgeted
        cap = self.total_steps * (20 if budgeted else 1)  # a budgeted worker may do more than its share
        while self.step < cap and not stop:
            epoch, skip = divmod(self.step, len(self.loader))
            for i, batch in enumerate(self.loader.epoch(epoch)):
                if i < skip:
                    continue  # resuming mid-epoch
                progress = self.strategy.progress()
                at = self.step if progress is None else progress
                lr = peak * lr_factor(at, self.total_steps, self.warmup, cfg.train.lr_schedule)
                for g in self.optimizer.param_groups:
                    g["lr"] = lr
                self.where = f"step {self.step + 1}"
                profiler.before(self.step + 1)
                # the process's CPU (compute, the collectives' threads, its system calls), and the host
                # kernel's, all processes and softirq together (what moving the bytes costs:
                # sim/calibrate.py), read by the first worker only: it is the same host-wide count
                kernel0 = host_kernel_cpu() if ctx.worker == 0 else None
                before, cpu0 = self.tcp.read(), time.process_time()
                stats = self.strategy.step(batch)
                cpu = time.process_time() - cpu0
                kernel1 = host_kernel_cpu() if kernel0 is not None else None
                kernel = kernel1 - kernel0 if kernel1 is not None else None
                moved = self.tcp.read() - before
                profiler.after(self.step + 1)
                tracer.counter("bytes", sent=moved.sent, recv=moved.recv)
                marks = {k: stats.extra[k] for k in ("staleness", "weight", "density") if stats.extra.get(k) is not None}
                if marks:
                    tracer.counter("strategy", **marks)
                clock.skip(stats.paused_s)  # held still while another worker evaluated
                self.step += 1
                self.recorder.write(
                    "step", worker=ctx.worker, step=self.step, progress=at + 1, epoch=epoch, t=clock.now(), wall=time.time(),
                    loss=stats.loss, lr=lr, compute_s=stats.compute_s, exposed_s=stats.exposed_s, cpu_s=cpu,
                    host_kernel_cpu_s=kernel,
                    wait_s=stats.wait_s, t_ready=stats.t_ready, bytes_sent=moved.sent, bytes_recv=moved.recv,
                    payload_sent=stats.payload_sent, payload_recv=stats.payload_recv, applied=stats.applied,
                    paused_s=stats.paused_s, **stats.extra,
                )
                last = self.strategy.finished() or (not budgeted and self.step >= self.total_steps) or self.step >= cap
                if evaluator and (self.step % self.eval_every == 0 or last):
                    stop = self.evaluate(clock, epoch) or stop
                if cfg.train.checkpoint_every and self.step % cfg.train.checkpoint_every == 0:
                    self.strategy.settle()
                    checkpoint.save(ctx.out_dir, self.step, ctx.rank, self.state_dict(clock.now()))
                if last or stop:
                    stop = True
                    break
        self.recorder.write("end", worker=ctx.worker, step=self.step, t=clock.now(), wall=time.time())
        self.strategy.close()
        self.recorder.close()
        return TrainResult(self.step, self.last_accuracy, self.reached_at)

    def evaluate(self, clock: Clock, epoch: int) -> bool:
        """Score the held-out split; returns True when training should stop at the target."""
        clock.pause()
        self.where = f"evaluation after step {self.step}"
        ctx, s = self.ctx, self.strategy
        parts = ctx.workers if s.collective_eval else 1
        part = ctx.worker if s.collective_eval else 0
        with trace.get().span("evaluation", "eval"), s.evaluating():
            began = time.time()
            res = evaluate(s.eval_model(), self.data.test, self.stats, ctx.device, part, parts, ctx.group)
            ended = time.time()
        t = clock.now()
        clock.resume()
        self.last_accuracy = res.accuracy
        target = self.cfg.train.target_accuracy
        if target is not None and self.reached_at is None and res.accuracy >= target:
            self.reached_at = t
        self.recorder.write("eval", worker=ctx.worker, step=self.step, epoch=epoch, t=t, wall=time.time(),
                            began=began, ended=ended, accuracy=res.accuracy, test_loss=res.loss, samples=res.samples)
        return bool(self.cfg.train.stop_at_target and self.reached_at is not None and s.end_at_target())
