"""Layer-aware transmission for the parameter servers (--layer-strategy auto), the server side.

`LayerServer` has the same shard, policies and commit as `Server` (server.py): a worker's step
arrives as one message per layer, the last carrying END_OF_STEP, and is committed whole; one SGD
step runs per layer (the spans a worker replays); a bounded log of applied factors is kept per
sufficient-factor layer, and each layer is answered in priority order, the valued ones from a
snapshot of the shard, the sufficient-factor ones as the factors since the worker's copy (or, for
a worker further behind than the log, its values and momentum: a refresh).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Optional

import torch

from ringps import trace
from ringps.ps import wire
from ringps.ps.layers import METHOD_IDS, LayerSpec, f32, sf_gradient, sf_size
from ringps.ps.policies import Push
from ringps.ps.server import Outcome, Server

LOG_LIMIT = 64  # factor updates kept per layer; a worker further behind is refreshed


class LayerServer(Server):
    """Serves OP_LAYER steps: the same commit as `Server`, one SGD step per layer, replies in priority order."""

    def __init__(self, *args, specs: list[LayerSpec], **kw):
        super().__init__(*args, **kw)
        self.specs = [s for s in specs if s.server == self.index]  # this server's layers, priority order
        self.by_index = {s.index: s for s in self.specs}
        self.spans = [(s.local, s.local + s.numel) for s in self.specs]
        self.valued = [s for s in self.specs if s.method != "sf"]  # layers replied as values
        self.logs = {s.index: deque() for s in self.specs if s.method == "sf"}  # (version after, entry)
        # where each valued layer lies in a snapshot: its own place when every layer is valued (the
        # snapshot is then the shard, as DC-ASGD's backup needs), else packed (sf layers left out)
        self.offsets, at = {}, 0
        for s in self.valued:
            self.offsets[s.index] = s.local if not self.logs else at
            at += s.numel
        self.snapshots.numel = self.n if not self.logs else at
        self.known: dict[int, Optional[int]] = {w: None for w in self.workers}  # version each worker's copy has

    def expect(self, worker: int) -> wire.Expect:
        e = super().expect(worker)
        e.payload = 2 * self.n  # a layer message is checked against the plan in `_layer_payload`
        return e

    def update(self, grad: torch.Tensor, verdict, lr: float, push: Optional[Push] = None) -> None:
        super().update(grad, verdict, f32(lr), push)  # the lr travels in the factor log as float32

    def updated(self, factors: list[float], lr: float, push: Optional[Push]) -> None:
        if not self.logs:
            return
        by_tensor = {p.tensor_index: f for p, f in zip(self.pieces, factors)}
        for index, log in self.logs.items():
            rows, factors_t = push.extra[index]
            t = self.by_index[index].tensors
            head = torch.tensor([rows, lr, by_tensor[t[0]], by_tensor[t[1]] if len(t) > 1 else 1.0])
            log.append((self.shard.version, torch.cat([head, factors_t])))
            while len(log) > LOG_LIMIT:
                log.popleft()

    def factors_of(self, verdict) -> list[float]:
        return [f32(f) for f in verdict.factors(len(self.pieces))]

    # -- receiving a step -----------------------------------------------------------------
    def _layer_payload(self, h: wire.Header) -> tuple[Optional[LayerSpec], Optional[torch.Tensor], Optional[str]]:
        spec = self.by_index.get(h.layer)
        if h.op != wire.OP_LAYER or spec is None:
            return None, None, f"op {h.op}, layer {h.layer} is not a layer of server {self.index}"
        expected = {"dense": spec.numel, "fp16": spec.numel, "topk": 2 * h.k,
                    "sf": sf_size(spec, h.rows) if spec.method == "sf" else -1}[spec.method]
        bounded = 0 <= h.rows <= max(spec.numel, 1 << 16) and 0 <= h.k <= spec.numel
        if h.method != METHOD_IDS[spec.method] or h.payload != expected or not bounded:
            return spec, None, (f"layer {spec.name}: {wire.METHODS.get(h.method, h.method)} payload {h.payload} "
                                "does not match the plan")
        buf = torch.empty(h.payload, dtype=torch.float16 if spec.method == "fp16" else torch.float32)
        self._recv(h.sender, (buf, wire.TAG_PAYLOAD, f"layer {spec.name}'s payload"))
        return spec, buf, None

    def decode(self, parts: list, grad: torch.Tensor) -> dict:
        """The step's layers into one dense gradient of the shard; returns the sf factors by layer."""
        factors = {}
        for spec, h, payload in parts:
            g = grad[spec.local : spec.local + spec.numel]
            if spec.method == "sf":
                sf_gradient(spec, payload, h.rows, g)
                factors[spec.index] = (h.rows, payload)
            elif spec.method == "topk":
                g.zero_().index_add_(0, payload[: h.k].view(torch.int32).long(), payload[h.k :])
            else:
                g.copy_(payload)
        return factors

    def requests(self, worker: int) -> None:
        raw = wire.empty_header()
        sample = torch.empty(self.sample_n) if self.sample_n else None
        parts: list = []
        while (h := self.next_request(worker, raw)) is not None:
            if h.op == wire.OP_PULL:
                self.hold(worker, h)
                if h.flags & (wire.FLAG_HOLD | wire.FLAG_RELEASE | wire.FLAG_FINISH):  # values follow by a refresh
                    self._reply(worker, wire.Header(wire.OP_REPLY, self.rank, self.index), None)
                else:
                    self.known[worker] = None  # a refresh: values (and momentum) of every layer
                    self.reply_all(worker, h, None, 0.0)
                continue
            spec, payload, why = self._layer_payload(h)
            if why is None and h.flags & wire.FLAG_END_OF_STEP and sorted(s.index for s, _, _ in parts + [(spec, h, payload)]) \
                    != [s.index for s in self.specs]:
                why = f"step {h.step} ended without every layer of server {self.index}"
            if why is not None:  # sizes are checked against the plan here
                self.refuse(worker, h, why, False)
                self.failed[worker] = f"protocol violation: {why}"
                return
            parts.append((spec, h, payload))
            if not h.flags & wire.FLAG_END_OF_STEP:
                continue
            if sample is not None:
                self._recv(worker, (sample, wire.TAG_SAMPLE, "a value sample"))
            t0 = time.perf_counter()
            buf = self.recv.acquire(f"server rank {self.rank}: worker rank {worker}'s step ")
            try:
                grad = buf[: self.n]
                factors = self.decode(parts, grad)  # outside the lock: a 40 MB rebuild takes tens of ms
                t1 = time.perf_counter()
                o, push = self.commit(worker, h, grad, sample, extra=factors)
                t2 = time.perf_counter()
            finally:
                self.recv.release(buf)
            parts = []
            held = self.settle(push)
            t3 = time.perf_counter()
            self.reply_all(worker, h, o, held)
            tr = trace.get()
            if tr.enabled:
                self.trace_push(tr, f"worker {worker}", (t0, t1, t2, t3, time.perf_counter()), o)

    def _fill(self, buf: torch.Tensor) -> None:
        for s in self.valued:
            buf[self.offsets[s.index] : self.offsets[s.index] + s.numel].copy_(self.shard.values[s.local : s.local + s.numel])

    def reply_all(self, worker: int, h: wire.Header, o: Optional[Outcome], held: float) -> None:
        """Every layer, in priority order: values, or the factors since the worker's copy."""
        s = self.shard
        with s.cond:
            snap = self.snapshots.acquire(self._fill, s.version, share_older=False)  # the current version
            version, since, bodies = snap.version, self.known[worker], []
            for spec in self.specs:
                if spec.method != "sf":
                    at = self.offsets[spec.index]
                    bodies.append((snap.values[at : at + spec.numel], 0, 0))
                    continue
                log = [e for v, e in self.logs[spec.index] if since is not None and since < v <= version]
                if since is not None and len(log) == version - since:
                    bodies.append((torch.cat(log) if log else torch.empty(0), len(log), 0))
                else:  # the log does not reach back: values and momentum
                    lo, hi = spec.local, spec.local + spec.numel
                    bodies.append((torch.cat([s.values[lo:hi], s.momentum[lo:hi]]), 0, wire.FLAG_REFRESH))
            self.known[worker] = version
            updates, finish = self.applied, wire.FLAG_FINISH if self.finished else 0
        try:
            self.policy.sent(worker, snap.values)
            for i, (spec, (body, entries, flags)) in enumerate(zip(self.specs, bodies)):
                reply = wire.Header(wire.OP_REPLY, self.rank, self.index, version=version, payload=body.numel(),
                                    layer=spec.index, entries=entries, flags=flags, step=h.step, updates=updates)
                if i == 0:  # the job's end and the step's figures, once
                    reply.flags |= finish
                if o is not None and i == 0:
                    reply.status, reply.staleness, reply.weight = o.status, o.staleness, o.verdict.weight
                    reply.value_staleness, reply.held_us, reply.paused_us = (o.verdict.value_staleness, int(held * 1e6),
                                                                             int(o.paused * 1e6))
                self._reply(worker, reply, body)
        finally:
            self.snapshots.release(snap)
