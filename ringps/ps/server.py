"""A parameter server rank: one shard (values, momentum, version), one thread per worker.

Each worker has its own handler thread blocked on that worker's next header (the wire half,
handlers.py), so a large or slow transfer from one worker never stalls the others. A push is
received into a pooled buffer, then committed under the shard's lock in one routine for plain
and layered pushes (`commit`): the policy judges it (server 0 judges for all servers when the
verdict depends on the push, see policies/base.py), applies it, and it is accounted; the
receive buffer goes back to the pool, and the policy may hold the reply (SSP's bound, BSP's
round). The reply is sent from a shared, versioned snapshot of the values (buffers.py), taken
under the lock, so the version in a reply header is always the version of the values that
follow it.

Memory: values and momentum, plus at most `buffers` receive buffers and `buffers` snapshots of
the shard, whatever the number of workers (DC-ASGD adds its per-worker backups).
Passes over a push's bytes on the server: the receive writes them once; weight decay, momentum
and the values' update read the gradient once each (SGD's own arithmetic); a scale or weight
other than 1 adds one pass; the reply's snapshot copy is one read and one write of the values,
made once per version however many replies share it, and the send reads it once.

Evaluation holds the job still. Worker 0 scores the model while the others train on; its clock
leaves evaluation out, so an asynchronous job whose other workers kept pushing meanwhile would
learn in time that is never counted. The evaluator pulls with FLAG_HOLD, every other push waits
at the server until its FLAG_RELEASE, and the wait comes back in the reply (`paused_us`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist

from ringps.errors import ConfigError, ProtocolError, WorkerFailed
from ringps.ps import wire
from ringps.ps.buffers import BufferPool, SnapshotPool
from ringps.ps.handlers import Handlers
from ringps.ps.layout import Layout
from ringps.ps.policies import Policy, Push, Verdict
from ringps.record import Recorder

BUFFERS = 4  # receive buffers and reply snapshots per server (each), whatever the number of workers


def sgd_step(values: torch.Tensor, momentum: torch.Tensor, grad: torch.Tensor, lr: float, mu: float, wd: float) -> None:
    """torch.optim.SGD's step (momentum, no dampening, L2 weight decay), in place. The server and
    a worker replaying sufficient factors run exactly this, so their copies stay bit-identical."""
    if wd:
        grad.add_(values, alpha=wd)
    if mu:
        momentum.mul_(mu).add_(grad)
        grad = momentum
    values.add_(grad, alpha=-lr)


class Outcome(NamedTuple):
    """What became of one push."""

    status: int  # wire.APPLIED or wire.DROPPED
    verdict: Verdict
    held: float  # seconds the reply was held by the policy (sync round, SSP bound)
    paused: float  # seconds the push waited for another worker's evaluation
    staleness: int  # versions behind when it was judged


class Committed(NamedTuple):
    outcome: Outcome
    push: Push  # what the policy's hold needs


class Shard:
    def __init__(self, values: torch.Tensor):
        self.values = values
        self.momentum = torch.zeros_like(values)
        self.version = 0
        self.cond = threading.Condition()


class Server(Handlers):
    def __init__(self, rank: int, index: int, workers: list[int], layout: Layout, policy: Policy,
                 initial: torch.Tensor, momentum: float, weight_decay: float, timeout: float,
                 recorder: Optional[Recorder] = None, checkpoint_every: int = 0, out_dir: Optional[Path] = None,
                 sample_seed: int = 0, budget: int = 0, server_ranks: Optional[tuple[int, ...]] = None,
                 buffers: int = BUFFERS):
        self.rank, self.index, self.workers = rank, index, list(workers)
        self.layout, self.policy, self.timeout = layout, policy, timeout
        self.mu, self.wd = momentum, weight_decay
        self.server_ranks = tuple(server_ranks) if server_ranks else (rank,)
        self.judge = self.server_ranks[0]  # judges every step for a `judged` policy
        self.shard = Shard(initial.clone())
        self.n = layout.shard_numel(index)
        self.pieces = layout.pieces(index)
        self.spans: list[tuple[int, int]] = [(0, self.n)]  # what one SGD step covers (layer mode: a layer)
        self.sample_pos = layout.sample_positions(index, policy.fraction, seed=sample_seed) if policy.needs_sample else []
        self.sample_n = sum(p.numel() for p in self.sample_pos)
        self.recorder, self.checkpoint_every, self.out_dir = recorder, checkpoint_every, out_dir
        self.budget = budget  # total updates the job may apply (0: no limit)
        self.recv = BufferPool(self.n + self.sample_n, buffers, timeout)
        self.snapshots = SnapshotPool(self.n, buffers, self.shard.cond, timeout)
        self._write = threading.Lock()
        self._verdicts: dict[int, list] = {}  # worker -> verdict sends in flight (server 0)
        self.live = set(workers)
        self.failed: dict[int, str] = {}
        self.holder: Optional[int] = None  # the worker evaluating now (FLAG_HOLD), if any
        self.finished = False  # the evaluator ended the job at its target (FLAG_FINISH): replies say so
        # statistics
        self.applied = self.dropped = self.refused = 0
        self.histogram: Counter = Counter()
        self.max_applied_staleness = 0
        self.value_staleness: list[float] = []
        # what scaled the applied pushes' gradients (vsgd, stale-lr): their sum, least, and how many were below 1
        self.weight_sum, self.weight_min, self.pushes_weighted = 0.0, 1.0, 0
        self.started = self.ended = 0.0
        self.first_push = self.last_push = 0.0  # pushes/s counts from the first push to the last

    @classmethod
    def from_config(cls, cfg, ctx, layout: Layout, policy: Policy, initial: torch.Tensor, budget: int = 0,
                    **extra: Any) -> "Server":
        """The server `ringps train` runs on a server rank: SGD settings, checkpoints and the
        sample seed from the config, ranks and timeout from the worker context."""
        t = cfg.train
        return cls(ctx.rank, ctx.server_ranks.index(ctx.rank), list(ctx.worker_ranks), layout, policy, initial,
                   momentum=policy.server_momentum, weight_decay=t.weight_decay,
                   timeout=ctx.timeout,
                   recorder=Recorder(ctx.out_dir, ctx.rank), checkpoint_every=cfg.ps.ps_checkpoint_every,
                   out_dir=ctx.out_dir, sample_seed=cfg.run.seed, budget=budget, server_ranks=ctx.server_ranks, **extra)

    # -- the update (callers hold the shard's lock) -----------------------------------------
    def update(self, grad: torch.Tensor, verdict: Verdict, lr: float, push: Optional[Push] = None) -> None:
        """One SGD step with `grad` scaled by the verdict (before momentum), span by span."""
        factors = self.factors_of(verdict)
        for piece, f in zip(self.pieces, factors):
            if f != 1.0:
                grad[piece.start : piece.start + piece.numel].mul_(f)
        s = self.shard
        for lo, hi in self.spans:
            sgd_step(s.values[lo:hi], s.momentum[lo:hi], grad[lo:hi], lr, self.mu, self.wd)
        s.version += 1
        self.updated(factors, lr, push)
        if self.checkpoint_every and s.version % self.checkpoint_every == 0:
            self.save_checkpoint()

    def factors_of(self, verdict: Verdict) -> list[float]:
        """The factor each tensor piece of the shard is multiplied by."""
        return verdict.factors(len(self.pieces))

    def updated(self, factors: list[float], lr: float, push: Optional[Push]) -> None:
        """After every applied update, under the lock (layer mode logs the factors)."""

    # -- one push: judge, apply, account; then the policy's hold --------------------------
    def commit(self, worker: int, h: wire.Header, grad: torch.Tensor, sample: Optional[torch.Tensor],
               extra: Any = None) -> "Committed":
        remote = self.await_verdict(worker, h.step) if self.policy.judged and self.rank != self.judge else None
        s = self.shard
        with s.cond:
            paused = self.await_release(worker)
            push = Push(worker, h.step, h.version, s.version - h.version, h.lr, s.values, sample, self.sample_pos,
                        seen_version=s.version, extra=extra)
            if remote is None:
                verdict = self.policy.admit(push)
            else:
                push.staleness = remote.staleness
                verdict = Verdict(remote.status == wire.APPLIED, scale=remote.scale, reason="judged by server 0")
                verdict = self.policy.weigh(push, verdict) if verdict.apply else verdict
            if verdict.apply:
                self.policy.apply(self, push, verdict, grad)
            self.account(worker, h, push.staleness, verdict)
            s.cond.notify_all()
        if self.policy.judged and self.rank == self.judge and len(self.server_ranks) > 1:
            self.tell_peers(worker, h.step, push.staleness, verdict)
        status = wire.APPLIED if verdict.apply else wire.DROPPED
        return Committed(Outcome(status, verdict, 0.0, paused, push.staleness), push)

    def settle(self, push: Push) -> float:
        """The policy's hold before the reply; returns the seconds held."""
        t0 = time.perf_counter()
        with self.shard.cond:
            self.policy.hold(self, push)
        return time.perf_counter() - t0

    def push(self, worker: int, h: wire.Header, grad: torch.Tensor, sample: Optional[torch.Tensor]) -> Outcome:
        """Commit one push and wait out the policy's hold (what a handler does, minus the wire)."""
        o, p = self.commit(worker, h, grad, sample)
        return o._replace(held=self.settle(p))

    def account(self, worker: int, h: wire.Header, staleness: int, verdict: Verdict) -> None:
        """Every push, plain or layered, applied or dropped, is counted here once."""
        if verdict.apply:
            self.applied += 1
            self.max_applied_staleness = max(self.max_applied_staleness, staleness)
            self.weight_sum += verdict.weight
            self.weight_min = min(self.weight_min, verdict.weight)
            self.pushes_weighted += verdict.weight < 1.0
        else:
            self.dropped += 1
        self.histogram[staleness] += 1
        self.value_staleness.append(verdict.value_staleness)
        now = time.perf_counter()
        self.first_push = self.first_push or now
        self.last_push = now
        if self.recorder is not None:
            with self._write:
                self.recorder.write("push", server=self.index, rank=self.rank, worker=worker, step=h.step,
                                    t=now - self.started, wall=time.time(), staleness=staleness,
                                    value_staleness=verdict.value_staleness, weight=verdict.weight,
                                    applied=verdict.apply, reason=verdict.reason, version=self.shard.version)

    # -- agreement between servers: server 0 judges ----------------------------------------
    def tell_peers(self, worker: int, step: int, staleness: int, verdict: Verdict) -> None:
        """Send the verdict without waiting: a gloo send completes only once the peer posts its
        receive, which it does after it has received the step's gradient. The previous verdict
        for this worker has long been received (the worker got that step's replies from every
        server), so waiting for it here costs nothing and keeps one send in flight per worker."""
        self.flush_verdicts(worker)
        h = wire.Header(wire.OP_VERDICT, self.rank, self.index, step=step, worker=worker, staleness=staleness,
                        status=wire.APPLIED if verdict.apply else wire.DROPPED, scale=verdict.scale)
        raw = h.encode()
        self._verdicts[worker] = [(dist.isend(raw, dst=p, tag=wire.TAG_VERDICT_BASE + worker), p, step)
                                  for p in self.server_ranks[1:]]

    def flush_verdicts(self, worker: int) -> None:
        for w, p, step in self._verdicts.pop(worker, []):
            self._wait(w, f"sending server rank {p} the verdict on worker rank {worker}'s step {step}")

    def await_verdict(self, worker: int, step: int) -> wire.Header:
        raw = wire.empty_header()
        work = dist.irecv(raw, src=self.judge, tag=wire.TAG_VERDICT_BASE + worker)
        self._wait(work, f"waiting for server rank {self.judge}'s verdict on worker rank {worker}'s step {step}")
        h = wire.Header.decode(raw)
        if (h.op, h.worker, h.step) != (wire.OP_VERDICT, worker, step):
            raise ProtocolError(f"server rank {self.rank}: a verdict for worker {h.worker} step {h.step} came "
                                f"while worker {worker}'s step {step} waited for one")
        return h

    # -- the evaluation hold ------------------------------------------------------------------
    def await_release(self, worker: int) -> float:
        """Under the shard's lock: wait while another live worker holds the job for an evaluation;
        returns the seconds waited."""
        if self.holder in (None, worker):
            return 0.0
        holder, t0 = self.holder, time.perf_counter()
        if not self.shard.cond.wait_for(lambda: self.holder in (None, worker) or self.holder not in self.live,
                                        timeout=self.timeout):
            raise WorkerFailed(f"server rank {self.rank}: worker rank {worker}'s push waited {self.timeout:g}s for "
                               f"worker rank {holder} to finish evaluating (raise --timeout for a long evaluation)")
        return time.perf_counter() - t0

    def hold(self, worker: int, h: wire.Header) -> None:
        """FLAG_HOLD / FLAG_RELEASE of a pull: start or end `worker`'s evaluation pause; FLAG_FINISH:
        the job is over (a round or a bound the policy holds a reply for is then waited out no more)."""
        with self.shard.cond:
            first = bool(h.flags & wire.FLAG_FINISH) and not self.finished
            if h.flags & wire.FLAG_FINISH:
                self.finished = True
                self.shard.cond.notify_all()
            if h.flags & wire.FLAG_HOLD:
                self.holder = worker
            elif h.flags & wire.FLAG_RELEASE and self.holder == worker:
                self.holder = None
                self.shard.cond.notify_all()
            version = self.shard.version
        if first and self.recorder is not None:  # from here on every reply tells its worker to stop
            with self._write:
                self.recorder.write("finish", server=self.index, rank=self.rank, worker=worker,
                                    t=time.perf_counter() - self.started, wall=time.time(), version=version)

    # -- checkpoints and statistics ----------------------------------------------------------
    def save_checkpoint(self) -> None:
        if self.out_dir is None:
            return
        folder = Path(self.out_dir) / "checkpoints" / f"server{self.index}"
        folder.mkdir(parents=True, exist_ok=True)
        state = {"values": self.shard.values.clone(), "momentum": self.shard.momentum.clone(),
                 "version": self.shard.version, "fingerprint": self.layout.fingerprint,
                 "policy": self.policy.state_dict()}  # e.g. VSGD's recent distances: no re-warming on resume
        tmp = folder / "latest.tmp"
        torch.save(state, tmp)
        tmp.replace(folder / "latest.pt")

    def load_checkpoint(self, run_dir: Path) -> bool:
        f = Path(run_dir) / "checkpoints" / f"server{self.index}" / "latest.pt"
        if not f.is_file():
            return False
        state = torch.load(f, weights_only=False)
        if state["fingerprint"] != self.layout.fingerprint:
            raise ConfigError(f"--resume {run_dir}: server {self.index}'s checkpoint is for another parameter layout")
        self.shard.values.copy_(state["values"])
        self.shard.momentum.copy_(state["momentum"])
        self.shard.version = state["version"]
        self.policy.load_state_dict(state.get("policy", {}))
        return True

    def stats(self) -> dict[str, Any]:
        pushes = self.applied + self.dropped
        duration = max(self.last_push - self.first_push, 1e-9)
        vs = [v for v in self.value_staleness if v]
        return {
            "server": self.index, "pushes_applied": self.applied, "pushes_dropped": self.dropped,
            "pushes_refused": self.refused, "max_applied_staleness": self.max_applied_staleness,
            "staleness_histogram": {int(k): v for k, v in sorted(self.histogram.items())},
            "pushes_per_s": (pushes - 1) / duration if pushes > 1 else 0.0, "version": self.shard.version,
            "mean_value_staleness": sum(vs) / len(vs) if vs else None,
            # the applied pushes' weights (mean over a push's tensors): None where every one was 1
            "mean_weight": self.weight_sum / self.applied if self.pushes_weighted else None,
            "min_weight": self.weight_min if self.pushes_weighted else None,
            "pushes_weighted": self.pushes_weighted,  # applied with a weight below 1
            "failed_workers": {int(k): v for k, v in self.failed.items()},
            # the T in effect (threshold's default depends on the number of workers)
            "staleness_threshold": self.policy.threshold if self.policy.uses_threshold else None,
            "server_momentum": self.mu,  # the policy's (asynchronous ones offset asynchrony's own)
            "buffer_bytes": self.recv.nbytes + self.snapshots.nbytes, "snapshot_copies": self.snapshots.copies,
        }
