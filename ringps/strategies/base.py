"""The Strategy interface the Trainer drives, the per-worker context it gets, and step statistics.

A strategy owns everything between "here is a batch" and "the model has been updated":
forward, backward, communication, the optimizer step. The Trainer only loops, evaluates, records
and checkpoints, so adding an algorithm is one file plus `@STRATEGIES.register(name)`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ringps import trace
from ringps.registry import Registry

STRATEGIES: Registry = Registry("strategy")


@dataclass
class StepStats:
    """What one step cost this worker. Times in seconds."""

    loss: float
    compute_s: float  # forward + backward + optimizer math, including the --slowdown stretch
    exposed_s: float  # blocked on communication after compute ended (split into comm + wait later)
    wait_s: Optional[float] = None  # when the strategy knows its waiting time itself (e.g. a PS reply)
    payload_sent: int = 0  # bytes the algorithm handed to the transport
    payload_recv: int = 0
    t_ready: float = 0.0  # time.time() when this worker's gradients were ready (for the wait split)
    applied: bool = True  # False when e.g. a parameter server dropped this worker's push
    paused_s: float = 0.0  # of exposed_s: held still while another worker evaluated (left out of training time)
    extra: dict[str, Any] = field(default_factory=dict)  # strategy-specific figures for metrics rows


class Stretch:
    """--slowdown: sleep (f-1) times the last measured compute time, between forward and backward,
    so a slow worker's gradient really arrives later (and, under a parameter server, is staler)."""

    def __init__(self, factor: float = 1.0):
        self.factor = factor
        self.last_compute_s: Optional[float] = None

    def __call__(self, forward_s: float) -> float:
        if self.factor <= 1.0:
            return 0.0
        # first step: estimate backward as twice the forward
        base = self.last_compute_s if self.last_compute_s is not None else 3 * forward_s
        pause = (self.factor - 1.0) * base
        time.sleep(pause)
        return pause


@dataclass
class WorkerContext:
    """Who this process is and what it may use. Built by the launcher-side entry, once."""

    rank: int  # global rank in the job
    world_size: int
    worker: int  # index among the worker ranks (0..workers-1)
    workers: int
    group: Optional[dist.ProcessGroup]  # the worker ranks' group (None: the default group)
    device: torch.device
    backend: str
    timeout: float
    cfg: Any  # the validated Config
    out_dir: Path
    stretch: Stretch = field(default_factory=Stretch)
    server_ranks: tuple[int, ...] = ()
    worker_ranks: tuple[int, ...] = ()
    steps_per_epoch: int = 1  # set by the Trainer before setup
    sample_batch: Any = None  # one training batch, set by the Trainer (for profiling)


class Strategy:
    """Base class. Subclasses set `synchronous` and implement `setup` and `step`."""

    synchronous: bool = True  # every worker takes part in every step's communication
    collective_eval: bool = True  # all workers evaluate a part of the test split together
    needs_servers: bool = False  # the launcher starts cfg.run.servers extra ranks
    budgeted: bool = False  # the job's work is a global budget of steps shared by all workers

    def __init__(self, cfg: Any):
        self.cfg = cfg

    @classmethod
    def check(cls, cfg: Any) -> None:
        """Refuse, with a ConfigError of one line, a combination of options this strategy cannot
        run; called before any process starts."""

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx: WorkerContext) -> None:
        self.model, self.optimizer, self.ctx = model, optimizer, ctx

    def forward(self, module: nn.Module, batch) -> tuple[torch.Tensor, float, float]:
        """zero_grad, the forward pass and --slowdown's stretch, traced; returns the loss, the
        forward's start and the stretch's end (perf_counter seconds)."""
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=False)
        loss = loss_of(module, batch, self.ctx.device)
        t1 = time.perf_counter()
        pause = self.ctx.stretch(t1 - t0)
        t2 = time.perf_counter()
        self.forward_s = t1 - t0  # the stretch's base, with the backward's time (Stretch.last_compute_s)
        tr = trace.get()
        if tr.enabled:
            tr.add("forward", "compute", t0, t1)
            if pause:
                tr.add("slowdown", "compute", t1, t2, factor=self.ctx.stretch.factor)
        return loss, t0, t2

    def step(self, batch) -> StepStats:
        raise NotImplementedError

    def progress(self) -> Optional[int]:
        """Global steps done so far, when workers do not move in lockstep (drives the LR schedule)."""
        return None

    def finished(self) -> bool:
        """True once this worker's work is over before its own count of steps: the global budget
        used up (`budgeted`), or the job ended by the worker that evaluated (`end_at_target`)."""
        return False

    def end_at_target(self) -> bool:
        """The evaluation reached the target and --stop-at-target is set: end the job everywhere and
        return True, or return False where this worker cannot (then the job runs its whole length).
        Workers that evaluate together all saw the same accuracy and each stops on its own."""
        return self.collective_eval

    def settle(self) -> None:
        """Finish in-flight updates of the local model (before evaluating or saving it)."""

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Bracket an evaluation of `eval_model()`: the model is settled, and a strategy whose
        workers do not evaluate together holds the others still until it ends (their training
        in that time would be left out of the evaluator's clock)."""
        self.settle()
        yield

    def eval_model(self) -> nn.Module:
        """The module to evaluate (the bare model, never a DDP wrapper)."""
        return self.model

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass

    def serve(self, ctx: WorkerContext, model: nn.Module) -> None:
        """Entry for server ranks (strategies with `needs_servers`)."""
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        """Strategy-specific figures of this rank (ranks/rankR.summary.yaml)."""
        return {}

    @classmethod
    def merge_summary(cls, stats: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Top-level summary.json figures made from every rank's `summary()`."""
        return {}


def loss_of(model: nn.Module, batch, device: torch.device) -> torch.Tensor:
    x, y = batch.inputs.to(device, non_blocking=True), batch.targets.to(device, non_blocking=True)
    return F.cross_entropy(model(x), y)
