"""A parameter server's wire: one handler thread per worker, each blocked on that worker's next
header, so a large or slow transfer from one worker never stalls the others.

`Handlers` is the half of `Server` (server.py) that talks to workers: it validates each request
header (wire.validate), receives a push into a pooled buffer, hands it to the server's `commit`
and `settle` (judge, apply, account; the policy's hold), and replies from a versioned snapshot of
the values. A malformed or mismatched request is refused with a REFUSED reply, its payload taken
off the wire when the header says how long it is, so the worker's stream stays in step. A
worker that dies or goes silent ends its own handler only (its error in `failed`); `serve` then
fails the job if the policy is synchronous. LayerServer (layer_server.py) overrides `expect`
and `requests` for per-layer pushes and uses the rest as is.

What it uses of the server: rank, index, workers, timeout, shard (values, version, the lock),
layout, policy, n, sample_n, recv (receive buffers), snapshots, live, failed, finished, applied,
refused, recorder and its lock `_write`; it sets started and ended; and it calls hold, commit,
settle and flush_verdicts.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist

from ringps import trace
from ringps.comm.wait import wait
from ringps.errors import WorkerFailed, first_line
from ringps.ps import wire

if TYPE_CHECKING:
    from ringps.ps.server import Outcome


class Handlers:
    """The wire half of a parameter server (mixed into `Server`)."""

    def _wait(self, work, what: str) -> None:
        wait(work, self.timeout, f"server rank {self.rank}: {what}")

    def _recv(self, src: int, *parts: tuple[torch.Tensor, int, str]) -> None:
        """Receive (tensor, tag, what) parts from `src`, all posted at once: a push's gradient and
        value sample arrive together instead of one wake-up after the other."""
        works = [(dist.irecv(t, src=src, tag=tag), what) for t, tag, what in parts]
        for work, what in works:
            self._wait(work, f"receiving {what} from worker rank {src}")

    def _reply(self, dst: int, header: wire.Header, values: Optional[torch.Tensor]) -> None:
        works = [dist.isend(header.encode(), dst=dst, tag=wire.TAG_REPLY)]
        if values is not None:
            works.append(dist.isend(values, dst=dst, tag=wire.TAG_VALUES))
        for w in works:
            self._wait(w, f"replying to worker rank {dst}")

    def send_values(self, worker: int, header: wire.Header) -> None:
        """Reply with a snapshot of the values, its version in the header."""
        with self.shard.cond:
            snap = self.snapshots.acquire(lambda buf: buf.copy_(self.shard.values), self.shard.version)
        try:
            header.version, header.payload = snap.version, self.n
            self.policy.sent(worker, snap.values)
            self._reply(worker, header, snap.values)
        finally:
            self.snapshots.release(snap)

    def handle(self, worker: int) -> None:
        """Serve one worker until it stops: requests one after another (see `requests`)."""
        try:
            self.requests(worker)
            self.flush_verdicts(worker)
        except WorkerFailed:
            raise
        except Exception as e:  # noqa: BLE001 - a worker that dies or goes silent
            with self.shard.cond:
                self.failed[worker] = first_line(e)
        finally:
            with self.shard.cond:
                self.live.discard(worker)
                self.shard.cond.notify_all()

    def expect(self, worker: int) -> wire.Expect:
        return wire.Expect(worker, self.index, self.layout.fingerprint, self.n, self.sample_n, self.shard.version)

    def next_request(self, worker: int, raw: torch.Tensor) -> Optional[wire.Header]:
        """The next valid header from `worker`, or None once it stopped or was cut off."""
        while True:
            self._recv(worker, (raw, wire.TAG_HEADER, "a request header"))
            h, reason, drainable = wire.validate(raw, self.expect(worker))
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
        while (h := self.next_request(worker, raw)) is not None:
            if h.op == wire.OP_PULL:
                self.hold(worker, h)
                reply = wire.Header(wire.OP_REPLY, self.rank, self.index, step=h.step)
                if h.flags & (wire.FLAG_RELEASE | wire.FLAG_FINISH):  # nothing changed while it held: no values
                    self._reply(worker, reply, None)
                else:
                    self.send_values(worker, reply)
                continue
            tr, lane = trace.get(), f"worker {worker}"
            t0 = time.perf_counter()
            buf = self.recv.acquire(f"server rank {self.rank}: worker rank {worker}'s push ")
            try:
                grad, sample = buf[: self.n], (buf[self.n :] if self.sample_n else None)
                self._recv(worker, (grad, wire.TAG_PAYLOAD, "a gradient"),
                           *([(sample, wire.TAG_SAMPLE, "a value sample")] if sample is not None else []))
                t1 = time.perf_counter()
                o, push = self.commit(worker, h, grad, sample)
                t2 = time.perf_counter()
            finally:
                self.recv.release(buf)
            held = self.settle(push)
            t3 = time.perf_counter()
            self.send_values(worker, self.reply_header(h, o, held))
            if tr.enabled:
                self.trace_push(tr, lane, (t0, t1, t2, t3, time.perf_counter()), o)

    @staticmethod
    def trace_push(tr, lane: str, t: tuple, o: Outcome) -> None:
        """receive, judge and apply, hold, reply: one push on the server's lane for its worker."""
        verdict = wire.STATUS[o.status]
        tr.add("receive", "server", t[0], t[1], lane)
        start = t[1]
        if o.paused > 1e-4:  # held at the server while another worker evaluated
            start = min(t[2], t[1] + o.paused)
            tr.add("paused for an evaluation", "eval", t[1], start, lane)
        tr.add(f"judge+apply ({verdict})", "server", start, t[2], lane, verdict=verdict, staleness=o.staleness,
               weight=o.verdict.weight)
        if t[3] - t[2] > 1e-4:
            tr.add("hold", "server", t[2], t[3], lane)
        tr.add("reply", "server", t[3], t[4], lane)
        tr.counter("staleness", at=t[2], staleness=o.staleness)

    def reply_header(self, h: wire.Header, o: Outcome, held: float) -> wire.Header:
        return wire.Header(wire.OP_REPLY, self.rank, self.index, status=o.status, staleness=o.staleness,
                           weight=o.verdict.weight, step=h.step, updates=self.applied,
                           held_us=int(held * 1e6), value_staleness=o.verdict.value_staleness,
                           paused_us=int(o.paused * 1e6), flags=wire.FLAG_FINISH if self.finished else 0)

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
        if not self.policy.carries_on and self.failed:
            w = next(iter(self.failed))
            raise WorkerFailed(f"server rank {self.rank}: worker rank {w} failed in a synchronous job: {self.failed[w]}")
