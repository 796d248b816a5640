"""Layer-aware transmission for the parameter servers (--layer-strategy auto).

Worker side (`LayeredClient`):
- wait-free backprop: a layer's gradient leaves as soon as its backward finishes (gradient-ready
  hooks), on the communication thread, to the server the plan placed it on, by the plan's method
  (dense, fp16, top-k with error feedback, or sufficient factors (delta, x) for a fully connected
  layer); the last layer a server gets in a step carries END_OF_STEP (and VSGD's value sample);
- each server then commits the step whole (applied or dropped, judged once for all servers, see
  server.py) and answers every layer it holds in priority order (the layers the next forward
  needs first); each layer's forward waits only for its own update (forward pre-hooks), so the
  next forward starts before the whole model has arrived;
- a sufficient-factor layer's answer is the factors of every update the server applied since
  this worker's copy, each with its learning rate and scale, replayed through the same SGD step
  (`sgd_step`), so the copy stays exactly the server's; a worker too far behind gets the values
  and momentum instead (a refresh).

Server side (`LayerServer`): the same shard, policies and commit as `Server`; one SGD step per
layer (the spans a worker replays), a bounded log of applied factors per sufficient-factor layer,
and replies built from a snapshot of the layers sent as values.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from ringps import trace
from ringps.comm.thread import CommThread
from ringps.comm.wait import wait
from ringps.compress.memory import ErrorFeedback
from ringps.compress.selectors import SampledThreshold
from ringps.errors import CommTimeout, ProtocolError
from ringps.ps import wire
from ringps.ps.layout import Layout
from ringps.ps.policies import Push
from ringps.ps.server import Outcome, Server, sgd_step

METHOD_IDS = {"dense": wire.DENSE, "fp16": wire.FP16, "topk": wire.TOPK, "sf": wire.SF}
LOG_LIMIT = 64  # factor updates kept per layer; a worker further behind is refreshed
ENTRY_HEAD = 4  # a log entry: [rows, lr, weight factor, bias factor, factors...]


def f32(x: float) -> float:
    """x as the float32 the factor log carries, so server and replaying worker use the same bits."""
    return float(torch.tensor(x, dtype=torch.float32))


class LayerPayload(NamedTuple):
    """One layer's message body: the tensor, and how to read it."""

    body: torch.Tensor
    rows: int  # sufficient factors: batch rows of (delta, x)
    k: int  # top-k: (index, value) pairs


class LayerSpec:
    """One planned layer: its module, its range in the flat vector and in its server's shard, its method."""

    def __init__(self, index: int, name: str, module: nn.Module, start: int, numel: int, method: str, density: float,
                 server: int = 0, local: Optional[int] = None):
        self.index, self.name, self.module, self.start, self.numel = index, name, module, start, numel
        self.method, self.server = method, server
        self.local = start if local is None else local  # offset within the server's shard
        self.params = list(module.parameters(recurse=False))
        self.tensors: tuple[int, ...] = ()  # the layout's indices of its parameter tensors (weight first)
        self.density = density
        if method == "sf":
            self.out_features, self.in_features = module.weight.shape
            self.weight_numel = module.weight.numel()

    @property
    def k(self) -> int:
        return max(1, int(self.density * self.numel))


def layer_specs(model: nn.Module, plan, layout: Layout, density: float) -> list[LayerSpec]:
    """The plan's layers, in forward order, mapped to modules, flat ranges and their servers."""
    modules = dict(model.named_modules())
    offsets = dict(zip(layout.names, layout.offsets))
    specs = []
    for i, lp in enumerate(plan.layers):
        m = modules[lp.name]
        first = next(n for n, _ in m.named_parameters(recurse=False))
        start = offsets[f"{lp.name}.{first}" if lp.name else first]
        server = lp.server if layout.placement is not None else 0
        spec = LayerSpec(i, lp.name, m, start, lp.params, lp.method, density, server, layout.local(server, start))
        prefix = f"{lp.name}." if lp.name else ""
        spec.tensors = tuple(layout.names.index(prefix + n) for n, _ in m.named_parameters(recurse=False))
        specs.append(spec)
    return specs


def sf_gradient(spec: LayerSpec, factors: torch.Tensor, rows: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(delta, x, bias grad) -> the layer's flat gradient [weight, bias] = [delta^T x, bias grad],
    written into `out` when given (a 40 MB layer is rebuilt per update: no extra copies)."""
    o, i = spec.out_features, spec.in_features
    g = out if out is not None else torch.empty(spec.numel)
    delta = factors[: rows * o].view(rows, o)
    x = factors[rows * o : rows * (o + i)].view(rows, i)
    torch.mm(delta.t(), x, out=g[: spec.weight_numel].view(o, i))
    if spec.numel > spec.weight_numel:
        g[spec.weight_numel :].copy_(factors[rows * (o + i) : rows * (o + i) + o])
    return g


def sf_size(spec: LayerSpec, rows: int) -> int:
    return rows * (spec.out_features + spec.in_features) + (spec.numel - spec.weight_numel)


def replay(spec: LayerSpec, view: torch.Tensor, momentum: torch.Tensor, body: torch.Tensor, entries: int,
           scratch: torch.Tensor, mu: float, wd: float) -> None:
    """Apply `entries` logged factor updates to a layer's values and momentum, as the server did."""
    at = 0
    for _ in range(entries):
        rows, lr, fw, fb = (float(x) for x in body[at : at + ENTRY_HEAD])
        n = sf_size(spec, int(rows))
        g = sf_gradient(spec, body[at + ENTRY_HEAD : at + ENTRY_HEAD + n], int(rows), scratch)
        if fw != 1.0:
            g[: spec.weight_numel].mul_(fw)
        if fb != 1.0:
            g[spec.weight_numel :].mul_(fb)
        sgd_step(view, momentum, g, lr, mu, wd)
        at += ENTRY_HEAD + n


class LayeredClient:
    def __init__(self, rank: int, server_ranks: tuple[int, ...], model: nn.Module, specs: list[LayerSpec],
                 layout: Layout, values: torch.Tensor, grads: torch.Tensor, timeout: float, momentum: float,
                 weight_decay: float, sample_fraction: Optional[float] = None, sample_seed: int = 0):
        self.rank, self.servers, self.model, self.specs = rank, tuple(server_ranks), model, specs
        self.values, self.grads, self.fp, self.timeout = values, grads, layout.fingerprint, timeout
        self.mu, self.wd = momentum, weight_decay
        S = len(self.servers)
        self.count = [sum(s.server == i for s in specs) for i in range(S)]
        self.versions = [0] * S
        self.samples = [self._flat_positions(layout, i, sample_fraction, sample_seed) for i in range(S)] \
            if sample_fraction is not None else None
        self.ready = [threading.Event() for _ in specs]
        self.momenta = {s.index: torch.zeros(s.numel) for s in specs if s.method == "sf"}
        self.memory = ErrorFeedback()
        self.selector = SampledThreshold(seed=rank)
        self.thread = CommThread("ringps-layers")
        self.lr, self.step_no = 0.0, 0
        self.pushed = [0] * S
        self.errors: list[BaseException] = []
        self.waited_s = 0.0  # time forwards spent waiting for updates (exposed communication)
        self.paused_s = 0.0  # of which the servers held this worker's step for another's evaluation
        self.last: dict = {}  # the latest step's figures (staleness, applied)
        self.global_updates = 0
        self.job_finished = False  # a server said the job is over (another worker reached the target)
        self._inputs: dict[int, torch.Tensor] = {}
        self._deltas: dict[int, torch.Tensor] = {}
        self._pending: dict[int, int] = {}
        self._scratch: dict[int, torch.Tensor] = {}
        self._hooks = []
        self._install()

    @staticmethod
    def _flat_positions(layout: Layout, server: int, fraction: float, seed: int) -> torch.Tensor:
        """VSGD's sample positions of a server's shard, as positions in the flat vector."""
        pos = layout.sample_positions(server, fraction, seed=seed)
        return torch.cat([p - piece.start + piece.flat for p, piece in zip(pos, layout.pieces(server))])

    # -- hooks -------------------------------------------------------------------------------
    def _install(self) -> None:
        for spec in self.specs:
            self._hooks.append(spec.module.register_forward_pre_hook(lambda m, a, s=spec: self._wait_ready(s)))
            if spec.method == "sf":
                self._hooks.append(spec.module.register_forward_hook(lambda m, a, out, s=spec: self._capture(s, a[0], out)))
            for p in spec.params:
                self._hooks.append(p.register_post_accumulate_grad_hook(lambda t, s=spec: self._grad_ready(s)))

    def _wait_ready(self, spec: LayerSpec) -> None:
        if not self.ready[spec.index].is_set():
            t0 = time.perf_counter()
            if not self.ready[spec.index].wait(self.timeout):
                self._raise()
                raise CommTimeout(f"rank {self.rank}: timed out after {self.timeout:g}s waiting for the update of "
                                  f"layer {spec.name} from server rank {self.servers[spec.server]}")
            self.waited_s += time.perf_counter() - t0
        self._raise()

    def _capture(self, spec: LayerSpec, x: torch.Tensor, out: torch.Tensor) -> None:
        if torch.is_grad_enabled() and out.requires_grad:
            self._inputs[spec.index] = x.detach()
            out.register_hook(lambda g, s=spec: self._deltas.__setitem__(s.index, g.detach()))

    def _grad_ready(self, spec: LayerSpec) -> None:
        left = self._pending.get(spec.index, len(spec.params)) - 1
        self._pending[spec.index] = left
        if left == 0:
            s = spec.server
            self.pushed[s] += 1
            last = self.pushed[s] == self.count[s]  # this server's last layer of the step
            every = sum(self.pushed) == len(self.specs)
            self.ready[spec.index].clear()
            payload, rows, k = self._payload(spec)
            # the values this step was computed on: no reply lands before the step is committed
            sample = self.values[self.samples[s]] if last and self.samples is not None else None
            # the step's number and lr now: the comm thread may send this after the next step began
            step, lr = self.step_no, self.lr
            self.thread.submit(lambda: self._guard(self._push, spec, payload, rows, k, last, sample, every, step, lr))

    def _raise(self) -> None:
        if self.errors:
            raise self.errors[0]

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - surfaces in the training thread
            self.errors.append(e)
            for ev in self.ready:
                ev.set()

    # -- the wire ----------------------------------------------------------------------------
    def _wait(self, works: list, what: str, server: int) -> None:
        for w in works:
            wait(w, self.timeout, f"rank {self.rank}: {what} with server rank {server}")

    def _payload(self, spec: LayerSpec) -> "LayerPayload":
        """What a layer sends, taken in the autograd thread when the layer's gradient is complete."""
        g = self.grads[spec.start : spec.start + spec.numel]
        if spec.method == "dense":
            return LayerPayload(g.clone(), 0, 0)
        if spec.method == "fp16":
            return LayerPayload(g.half(), 0, 0)
        if spec.method == "topk":
            acc = self.memory.compensate(spec.name, g)
            sel = self.selector.select(acc, spec.k)
            self.memory.update(spec.name, sel.indices)
            k = sel.indices.numel()
            return LayerPayload(torch.cat([sel.indices.to(torch.int32).view(torch.float32), sel.values]), 0, k)
        delta, x = self._deltas.pop(spec.index), self._inputs.pop(spec.index)
        parts = [delta.reshape(-1), x.reshape(-1)]
        if spec.numel > spec.weight_numel:
            parts.append(g[spec.weight_numel :])
        return LayerPayload(torch.cat(parts), delta.shape[0], 0)

    def _push(self, spec: LayerSpec, payload: torch.Tensor, rows: int, k: int, last: bool,
              sample: Optional[torch.Tensor], every: bool, step: int, lr: float) -> None:
        srv = self.servers[spec.server]
        h = wire.Header(wire.OP_LAYER, self.rank, spec.server, version=self.versions[spec.server], payload=payload.numel(),
                        sample=0 if sample is None else sample.numel(), fingerprint=self.fp, lr=lr,
                        step=step, layer=spec.index, method=METHOD_IDS[spec.method], rows=rows, k=k,
                        flags=wire.FLAG_END_OF_STEP if last else 0)
        works = [dist.isend(h.encode(), dst=srv, tag=wire.TAG_HEADER), dist.isend(payload, dst=srv, tag=wire.TAG_PAYLOAD)]
        if sample is not None:
            works.append(dist.isend(sample, dst=srv, tag=wire.TAG_SAMPLE))
        with trace.get().span(f"push {spec.name}", "comm", lane="comm", method=spec.method, server=srv,
                              bytes=payload.numel() * payload.element_size()):
            self._wait(works, f"pushing layer {spec.name}", srv)
        if every:
            with trace.get().span("replies", "comm", lane="comm"):
                self._receive_all()

    def _receive_all(self) -> None:
        """Every layer's answer in priority order (each server sends its own layers in that order);
        each forward waits only for its own."""
        staleness, applied, told = 0, True, set()
        for spec in self.specs:
            srv = self.servers[spec.server]
            raw = wire.empty_header()
            self._wait([dist.irecv(raw, src=srv, tag=wire.TAG_REPLY)], f"waiting for layer {spec.name}", srv)
            h = wire.Header.decode(raw)
            if h.status == wire.REFUSED:
                raise ProtocolError(f"server rank {srv} refused layer {spec.name} (see its log)")
            self._apply_reply(spec, h, srv)
            if spec.server not in told:  # a server's figures come with its first layer
                told.add(spec.server)
                staleness = max(staleness, h.staleness)
                applied = applied and h.status == wire.APPLIED
                self.paused_s += h.paused_us / 1e6
                self.global_updates = max(self.global_updates, h.updates)
            self.job_finished = self.job_finished or bool(h.flags & wire.FLAG_FINISH)
            self.ready[spec.index].set()
        self.last = {"staleness": staleness, "applied": applied}

    def _apply_reply(self, spec: LayerSpec, h: wire.Header, srv: int) -> None:
        view = self.values[spec.start : spec.start + spec.numel]
        body = torch.empty(h.payload)
        self._wait([dist.irecv(body, src=srv, tag=wire.TAG_VALUES)], f"receiving layer {spec.name}", srv)
        if h.flags & wire.FLAG_REFRESH or spec.method != "sf":
            view.copy_(body[: spec.numel])
            if spec.method == "sf":
                self.momenta[spec.index].copy_(body[spec.numel :])
        else:
            scratch = self._scratch.setdefault(spec.index, torch.empty(spec.numel))
            replay(spec, view, self.momenta[spec.index], body, h.entries, scratch, self.mu, self.wd)
        self.versions[spec.server] = h.version

    # -- driving -------------------------------------------------------------------------------
    def _to_all(self, flags: int, what: str, values: bool) -> None:
        for s, srv in enumerate(self.servers):
            h = wire.Header(wire.OP_PULL, self.rank, s, fingerprint=self.fp, flags=flags)
            works = [dist.isend(h.encode(), dst=srv, tag=wire.TAG_HEADER)]
            if not values:
                raw = wire.empty_header()
                works.append(dist.irecv(raw, src=srv, tag=wire.TAG_REPLY))
            self._wait(works, what, srv)

    def refresh(self) -> None:
        """Pull every layer's values (and momentum for sf layers) from every server."""
        for ev in self.ready:
            ev.clear()
        self._to_all(0, "asking for values", values=True)
        self._receive_all()

    def hold(self) -> None:
        """Between steps (after `settle`): hold the job still for an evaluation, and fetch the
        servers' current values."""
        self._to_all(wire.FLAG_HOLD, "holding the job for an evaluation", values=False)
        self.refresh()

    def release(self) -> None:
        self._to_all(wire.FLAG_RELEASE, "releasing the job after an evaluation", values=False)

    def finish(self) -> None:
        """End the job on every server: the other workers stop after their current step."""
        self._to_all(wire.FLAG_FINISH, "ending the job at its target", values=False)

    def begin_step(self, lr: float, step: int) -> None:
        self._raise()
        self.lr, self.step_no = lr, step
        self.pushed = [0] * len(self.servers)
        self._pending.clear()

    def settle(self) -> None:
        """Wait until every layer's latest update has landed (before evaluating or saving)."""
        for spec in self.specs:
            self._wait_ready(spec)

    def close(self) -> None:
        self.settle()
        for h in self._hooks:
            h.remove()
        self.thread.close()
        for s, srv in enumerate(self.servers):
            raw = wire.empty_header()
            self._wait([dist.isend(wire.Header(wire.OP_STOP, self.rank, s, fingerprint=self.fp).encode(), dst=srv,
                                   tag=wire.TAG_HEADER), dist.irecv(raw, src=srv, tag=wire.TAG_REPLY)], "stopping", srv)


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
