"""A parameter server rank: one shard (values, momentum, version), one thread per worker.

Each worker has its own handler thread blocked on that worker's next header, so a large or slow
transfer from one worker never stalls the others; only the update itself (an SGD step on the
shard, milliseconds) holds the shard's lock, and each reply is sent from a per-worker snapshot
taken under the lock. Every push is recorded: staleness in versions, value staleness, weight,
applied or dropped. With a synchronous policy a dead worker ends the job; otherwise the server
carries on with the live ones.

Evaluation holds the job still. Worker 0 scores the model while the others train on; its clock
leaves evaluation out (so evaluating more often does not change time-to-accuracy), so an
asynchronous job whose other workers kept pushing meanwhile would learn in time that is never
counted (measured: ~30 s of a ~50 s time-to-accuracy on ORL faces, 2 cores), and worker 0's
next gradient would be computed on values an evaluation old. So the evaluator pulls with
FLAG_HOLD, every other push waits at the server until its FLAG_RELEASE, and the wait comes back
in the reply (`paused_us`) for the worker to leave out of its own clock as well.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist

from ringps.errors import CommTimeout, WorkerFailed, first_line
from ringps.ps import wire
from ringps.ps.layout import Layout
from ringps.ps.policies import VSGD, Policy
from ringps.train.metrics import Recorder


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
    verdict: Any  # the policy's Verdict (weight, value staleness)
    held: float  # seconds the reply was held by the policy (sync round, SSP bound)
    paused: float  # seconds the push waited for another worker's evaluation
    staleness: int  # versions behind when it was judged


class Shard:
    def __init__(self, values: torch.Tensor):
        self.values = values
        self.momentum = torch.zeros_like(values)
        self.version = 0
        self.cond = threading.Condition()


class Server:
    def __init__(self, rank: int, index: int, workers: list[int], layout: Layout, policy: Policy,
                 initial: torch.Tensor, momentum: float, weight_decay: float, timeout: float,
                 recorder: Optional[Recorder] = None, checkpoint_every: int = 0, out_dir: Optional[Path] = None,
                 sample_seed: int = 0, budget: int = 0):
        self.rank, self.index, self.workers = rank, index, list(workers)
        self.layout, self.policy, self.timeout = layout, policy, timeout
        self.mu, self.wd = momentum, weight_decay
        # an asynchronous push is one worker's batch: it moves the model 1/N of a synchronous step
        # (the mean of N batches), so a sample teaches as much under every policy
        self.push_share = 1.0 if policy.synchronous else 1.0 / len(workers)
        self.shard = Shard(initial.clone())
        self.n = layout.shard_numel(index)
        self.pieces = layout.pieces(index)
        self.sample_pos = layout.sample_positions(index, policy.fraction, seed=sample_seed) if policy.needs_sample else []
        self.sample_n = sum(p.numel() for p in self.sample_pos)
        self.recorder, self.checkpoint_every, self.out_dir = recorder, checkpoint_every, out_dir
        self.budget = budget  # total pushes the job may make (0: no limit); replies carry the count
        self._write = threading.Lock()
        # per-worker state
        self.snapshot = {w: torch.empty_like(self.shard.values) for w in workers}  # reply buffers (DC-ASGD backups)
        self.sent_once: set[int] = set()
        self.clock = Counter()  # pushes per worker (SSP)
        self.live = set(workers)
        self.pending: dict[int, torch.Tensor] = {}  # sync: this version's gradients
        self.failed: dict[int, str] = {}
        self.holder: Optional[int] = None  # the worker evaluating now (FLAG_HOLD), if any
        # statistics
        self.applied = self.dropped = self.refused = 0
        self.histogram: Counter = Counter()
        self.max_applied_staleness = 0
        self.value_staleness: list[float] = []
        self.started = self.ended = 0.0
        self.first_push = self.last_push = 0.0  # pushes/s counts from the first push to the last

    # -- the update ----------------------------------------------------------------------
    def sgd(self, grad: torch.Tensor, lr: float) -> None:
        """torch.optim.SGD's step (momentum, no dampening, L2 weight decay), on the flat shard."""
        s = self.shard
        sgd_step(s.values, s.momentum, grad, lr, self.mu, self.wd)
        s.version += 1
        if self.checkpoint_every and s.version % self.checkpoint_every == 0:
            self.save_checkpoint()

    def push(self, worker: int, h: wire.Header, grad: torch.Tensor, sample: Optional[torch.Tensor]) -> Outcome:
        """Apply (or not) one push."""
        s, held = self.shard, 0.0
        with s.cond:
            paused = self.await_release(worker)
            staleness = s.version - h.version
            if self.policy.synchronous:
                return Outcome(*self._sync(worker, h, grad), paused, 0)
            verdict = self.policy.judge(staleness)
            if verdict.apply and isinstance(self.policy, VSGD):
                distances = self.policy.distances(s.values, self.sample_pos, sample)
                verdict = self.policy.judge_values(distances)
                for piece, w in zip(self.pieces, verdict.weights):
                    if w != 1.0:
                        grad[piece.start : piece.start + piece.numel].mul_(w)
            if verdict.apply:
                backup = self.snapshot[worker] if (self.policy.needs_backup and worker in self.sent_once) else None
                grad = self.policy.transform(grad, s.values, backup)
                self.sgd(grad, h.lr * verdict.lr_scale * self.push_share)
                self.applied += 1
                self.max_applied_staleness = max(self.max_applied_staleness, staleness)
            else:
                self.dropped += 1
            self.histogram[staleness] += 1
            self.value_staleness.append(verdict.value_staleness)
            if self.policy.bounded:
                self.clock[worker] += 1
                t0 = time.perf_counter()
                s.cond.notify_all()
                ok = s.cond.wait_for(lambda: self.clock[worker] - min(self.clock[w] for w in self.live) <= self.policy.threshold
                                     or worker not in self.live, timeout=self.timeout)
                if not ok:
                    raise WorkerFailed(f"server rank {self.rank}: worker rank {worker} waited {self.timeout:g}s for the "
                                       f"slowest worker (SSP bound {self.policy.threshold})")
                held = time.perf_counter() - t0
            self.snapshot[worker].copy_(s.values)
            self.sent_once.add(worker)
            status = wire.APPLIED if verdict.apply else wire.DROPPED
            self.record(worker, h, staleness, verdict, status, s.version)
            return Outcome(status, verdict, held, paused, staleness)

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
        """FLAG_HOLD / FLAG_RELEASE of a pull: start or end `worker`'s evaluation pause."""
        with self.shard.cond:
            if h.flags & wire.FLAG_HOLD:
                self.holder = worker
            elif h.flags & wire.FLAG_RELEASE and self.holder == worker:
                self.holder = None
                self.shard.cond.notify_all()

    def _sync(self, worker: int, h: wire.Header, grad: torch.Tensor) -> tuple[int, Any, float]:
        """BSP: the last of the live workers to push applies the mean; the others wait for it."""
        from ringps.ps.policies import Verdict

        s = self.shard
        version = s.version
        if self.failed:
            first = next(iter(self.failed))
            raise WorkerFailed(f"server rank {self.rank}: synchronous round {version} lost worker rank {first} "
                               f"({self.failed[first]})")
        self.pending[worker] = grad
        t0 = time.perf_counter()
        if set(self.pending) >= self.live:
            mean = torch.stack([self.pending[w] for w in sorted(self.pending)]).mean(0)
            self.applied += len(self.pending)  # every worker's push went into the mean
            self.histogram[0] += len(self.pending)
            self.pending.clear()
            self.sgd(mean, h.lr)
            s.cond.notify_all()
        else:
            ok = s.cond.wait_for(lambda: s.version > version or self.failed, timeout=self.timeout)
            if self.failed:
                first = next(iter(self.failed))
                raise WorkerFailed(f"server rank {self.rank}: synchronous round {version} lost worker rank {first} "
                                   f"({self.failed[first]})")
            if not ok:
                missing = sorted(self.live - set(self.pending) - {worker})
                raise WorkerFailed(f"server rank {self.rank}: timed out after {self.timeout:g}s waiting for the pushes "
                                   f"of worker ranks {missing} for version {version}")
        held = time.perf_counter() - t0
        self.snapshot[worker].copy_(s.values)
        verdict = Verdict(True)
        self.record(worker, h, 0, verdict, wire.APPLIED, s.version)
        return wire.APPLIED, verdict, held

    def record(self, worker: int, h: wire.Header, staleness: int, verdict, status: int, version: int) -> None:
        now = time.perf_counter()
        self.first_push = self.first_push or now
        self.last_push = now
        if self.recorder is None:
            return
        with self._write:
            self.recorder.write("push", server=self.index, rank=self.rank, worker=worker, step=h.step,
                                t=time.perf_counter() - self.started, wall=time.time(), staleness=staleness,
                                value_staleness=verdict.value_staleness, weight=verdict.weight,
                                applied=status == wire.APPLIED, reason=verdict.reason, version=version)

    # -- the wire ------------------------------------------------------------------------
    def _recv(self, src: int, *parts: tuple[torch.Tensor, int, str]) -> None:
        """Receive (tensor, tag, what) parts from `src`, all posted at once: a push's gradient and
        value sample arrive together instead of one wake-up after the other (on a loaded machine each
        wake-up costs scheduling latency)."""
        works = [(dist.irecv(t, src=src, tag=tag), what) for t, tag, what in parts]
        for work, what in works:
            try:
                work.wait(timeout=timedelta(seconds=self.timeout))
            except RuntimeError as e:
                raise CommTimeout(f"server rank {self.rank}: receiving {what} from worker rank {src} failed after up "
                                  f"to {self.timeout:g}s: {first_line(e)}") from None

    def _reply(self, dst: int, header: wire.Header, values: Optional[torch.Tensor]) -> None:
        works = [dist.isend(header.encode(), dst=dst, tag=wire.TAG_REPLY)]
        if values is not None:
            works.append(dist.isend(values, dst=dst, tag=wire.TAG_VALUES))
        for w in works:
            w.wait(timeout=timedelta(seconds=self.timeout))

    def handle(self, worker: int) -> None:
        """Serve one worker until it stops: requests one after another (see `requests`)."""
        try:
            self.requests(worker)
        except WorkerFailed:
            raise
        except Exception as e:  # noqa: BLE001 - a worker that dies or goes silent
            with self.shard.cond:
                self.failed[worker] = first_line(e)
        finally:
            with self.shard.cond:
                self.live.discard(worker)
                self.shard.cond.notify_all()

    def next_request(self, worker: int, raw: torch.Tensor, version: int) -> Optional[wire.Header]:
        """The next valid header from `worker`, or None once it stopped or was cut off."""
        while True:
            self._recv(worker, (raw, wire.TAG_HEADER, "a request header"))
            exp = wire.Expect(worker, self.index, self.layout.fingerprint, self.n, self.sample_n, version)
            h, reason, drainable = wire.validate(raw, exp)
            if reason is None:
                break
            self.refuse(worker, h, reason, drainable)
            if not drainable:
                self.failed[worker] = f"protocol violation: {reason}"
                return None
        if h.op == wire.OP_STOP:
            self._reply(worker, wire.Header(wire.OP_REPLY, self.rank, self.index, status=wire.STOPPED), None)
            return None
        return h

    def requests(self, worker: int) -> None:
        raw = wire.empty_header()
        grad = torch.empty(self.n)
        sample = torch.empty(self.sample_n) if self.sample_n else None
        while (h := self.next_request(worker, raw, self.shard.version)) is not None:
            if h.op == wire.OP_PULL:
                self.hold(worker, h)
                if h.flags & wire.FLAG_RELEASE:  # nothing changed while it held: no values to send
                    self._reply(worker, wire.Header(wire.OP_REPLY, self.rank, self.index, version=self.shard.version), None)
                    continue
                with self.shard.cond:
                    self.snapshot[worker].copy_(self.shard.values)
                    self.sent_once.add(worker)
                    version = self.shard.version
                self._reply(worker, wire.Header(wire.OP_REPLY, self.rank, self.index, version=version,
                                                payload=self.n), self.snapshot[worker])
                continue
            self._recv(worker, (grad, wire.TAG_PAYLOAD, "a gradient"),
                       *([(sample, wire.TAG_SAMPLE, "a value sample")] if sample is not None else []))
            o = self.push(worker, h, grad, sample)
            reply = wire.Header(wire.OP_REPLY, self.rank, self.index, version=self.shard.version, payload=self.n,
                                status=o.status, staleness=o.staleness, weight=o.verdict.weight,
                                step=self.applied + self.dropped, held_us=int(o.held * 1e6),
                                value_staleness=o.verdict.value_staleness, paused_us=int(o.paused * 1e6))
            self._reply(worker, reply, self.snapshot[worker])

    def refuse(self, worker: int, h: Optional[wire.Header], reason: str, drainable: bool) -> None:
        if drainable and h is not None:  # take the payload off the wire so the stream stays in step
            self._recv(worker, (torch.empty(h.payload), wire.TAG_PAYLOAD, "a refused payload"),
                       *([(torch.empty(h.sample), wire.TAG_SAMPLE, "a refused sample")] if h.sample else []))
        with self.shard.cond:
            self.refused += 1
        if self.recorder is not None:
            with self._write:
                self.recorder.write("refused", server=self.index, rank=self.rank, worker=worker, reason=reason,
                                    wall=time.time())
        self._reply(worker, wire.Header(wire.OP_REPLY, self.rank, self.index, status=wire.REFUSED), None)

    def serve(self) -> None:
        """Serve every worker until each has stopped or failed."""
        self.started = time.perf_counter()
        errors: list[BaseException] = []

        def run(w: int) -> None:
            try:
                self.handle(w)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                with self.shard.cond:
                    self.failed.setdefault(w, str(e))
                    self.shard.cond.notify_all()

        threads = [threading.Thread(target=run, args=(w,), name=f"ps-worker{w}", daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.ended = time.perf_counter()
        if errors:
            raise errors[0]
        if self.policy.synchronous and self.failed:
            w = next(iter(self.failed))
            raise WorkerFailed(f"server rank {self.rank}: worker rank {w} failed in a synchronous job: {self.failed[w]}")

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
            from ringps.errors import ConfigError

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
            "failed_workers": {int(k): v for k, v in self.failed.items()},
            # the T in effect (threshold's default depends on the number of workers)
            "staleness_threshold": self.policy.threshold if self.policy.uses_threshold else None,
        }
