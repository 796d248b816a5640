"""Layer-aware transmission for the parameter servers (--layer-strategy auto).

Worker side (`LayeredClient`):
- wait-free backprop: a layer's gradient leaves as soon as its backward finishes (gradient-ready
  hooks), on the communication thread, by the plan's method (dense, fp16, top-k with error
  feedback, or sufficient factors (delta, x) for a fully connected layer);
- the step's last layer carries END_OF_STEP; the server then answers every layer of the step in
  priority order (the layers the next forward needs first), and each layer's forward waits only
  for its own update (forward pre-hooks), so the next forward starts before the whole model has
  arrived;
- a sufficient-factor layer's answer is the factors of every update the server applied since
  this worker's copy, replayed through the same SGD step (`sgd_step`), so the copy stays exactly
  the server's; a worker too far behind gets the values and momentum instead (a refresh).

Server side (`LayerServer`): the same shard and policies as `Server`, per-layer versions, and a
bounded log of applied factors per sufficient-factor layer.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from ringps.comm.thread import CommThread
from ringps.compress.memory import ErrorFeedback
from ringps.compress.selectors import SampledThreshold
from ringps.errors import CommTimeout, ProtocolError, WorkerFailed, first_line
from ringps.ps import wire
from ringps.ps.server import Server, sgd_step

METHOD_IDS = {"dense": wire.DENSE, "fp16": wire.FP16, "topk": wire.TOPK, "sf": wire.SF}
FLAG_REFRESH = 2  # reply: values (and momentum, for sf) rather than an update log
LOG_LIMIT = 64  # factor updates kept per layer; a worker further behind is refreshed


class LayerSpec:
    """One planned layer: its module, its range in the flat parameter vector, its method."""

    def __init__(self, index: int, name: str, module: nn.Module, start: int, numel: int, method: str, density: float):
        self.index, self.name, self.module, self.start, self.numel = index, name, module, start, numel
        self.method = method
        self.params = list(module.parameters(recurse=False))
        self.density = density
        if method == "sf":
            self.out_features, self.in_features = module.weight.shape
            self.weight_numel = module.weight.numel()

    @property
    def k(self) -> int:
        return max(1, int(self.density * self.numel))


def layer_specs(model: nn.Module, plan, layout, density: float) -> list[LayerSpec]:
    """The plan's layers, in forward order, mapped to modules and flat ranges."""
    modules = dict(model.named_modules())
    offsets = dict(zip(layout.names, layout.offsets))
    specs = []
    for i, lp in enumerate(plan.layers):
        m = modules[lp.name]
        first = next(n for n, _ in m.named_parameters(recurse=False))
        start = offsets[f"{lp.name}.{first}" if lp.name else first]
        specs.append(LayerSpec(i, lp.name, m, start, lp.params, lp.method, density))
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


def scratch(buffers: dict, key, numel: int) -> torch.Tensor:
    """A reused gradient buffer per key: a 40 MB layer is not reallocated per update."""
    if key not in buffers:
        buffers[key] = torch.empty(numel)
    return buffers[key]


def sf_size(spec: LayerSpec, rows: int) -> int:
    return rows * (spec.out_features + spec.in_features) + (spec.numel - spec.weight_numel)


class LayeredClient:
    def __init__(self, rank: int, server_rank: int, model: nn.Module, specs: list[LayerSpec], values: torch.Tensor,
                 grads: torch.Tensor, fingerprint: int, timeout: float, momentum: float, weight_decay: float):
        self.rank, self.server, self.model, self.specs = rank, server_rank, model, specs
        self.values, self.grads, self.fp, self.timeout = values, grads, fingerprint, timeout
        self.mu, self.wd = momentum, weight_decay
        self.versions = [0] * len(specs)
        self.ready = [threading.Event() for _ in specs]
        self.momenta = {s.index: torch.zeros(s.numel) for s in specs if s.method == "sf"}
        self.memory = ErrorFeedback()
        self.selector = SampledThreshold(seed=rank)
        self.thread = CommThread("ringps-layers")
        self.lr, self.step_no, self.pushed = 0.0, 0, 0
        self.errors: list[BaseException] = []
        self.waited_s = 0.0  # time forwards spent waiting for updates (exposed communication)
        self.paused_s = 0.0  # of which the server held this worker's layers for another's evaluation
        self.last: dict = {}  # the latest reply's figures (staleness, global pushes)
        self.global_pushes = 0
        self._inputs: dict[int, torch.Tensor] = {}
        self._deltas: dict[int, torch.Tensor] = {}
        self._pending: dict[int, int] = {}
        self._buffers: dict[int, torch.Tensor] = {}
        self._hooks = []
        self._install()

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
                                  f"layer {spec.name} from server rank {self.server}")
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
            self.pushed += 1
            last = self.pushed == len(self.specs)
            self.ready[spec.index].clear()
            payload, rows = self._payload(spec)
            self.thread.submit(lambda: self._guard(self._push, spec, payload, rows, last))

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
    def _wait(self, works: list, what: str) -> None:
        for w in works:
            try:
                w.wait(timeout=timedelta(seconds=self.timeout))
            except RuntimeError as e:
                raise CommTimeout(f"rank {self.rank}: {what} with server rank {self.server} failed after up to "
                                  f"{self.timeout:g}s: {first_line(e)}") from None

    def _payload(self, spec: LayerSpec) -> tuple[torch.Tensor, int]:
        """Taken in the autograd thread, right when the layer's gradient is complete."""
        g = self.grads[spec.start : spec.start + spec.numel]
        if spec.method == "dense":
            return g.clone(), 0
        if spec.method == "fp16":
            return g.half(), 0
        if spec.method == "topk":
            acc = self.memory.compensate(spec.name, g)
            sel = self.selector.select(acc, spec.k)
            self.memory.update(spec.name, sel.indices)
            return torch.cat([sel.indices.to(torch.int32).view(torch.float32), sel.values]), sel.indices.numel()
        delta, x = self._deltas.pop(spec.index), self._inputs.pop(spec.index)
        parts = [delta.reshape(-1), x.reshape(-1)]
        if spec.numel > spec.weight_numel:
            parts.append(g[spec.weight_numel :])
        return torch.cat(parts), delta.shape[0]

    def _push(self, spec: LayerSpec, payload: torch.Tensor, rows: int, last: bool) -> None:
        h = wire.Header(wire.OP_LAYER, self.rank, 0, version=self.versions[spec.index], payload=payload.numel(),
                        fingerprint=self.fp, lr=self.lr, step=self.step_no, layer=spec.index,
                        method=METHOD_IDS[spec.method], rows=rows, flags=wire.FLAG_END_OF_STEP if last else 0)
        self._wait([dist.isend(h.encode(), dst=self.server, tag=wire.TAG_HEADER),
                    dist.isend(payload, dst=self.server, tag=wire.TAG_PAYLOAD)], f"pushing layer {spec.name}")
        if last:
            self._receive_all()

    def _receive_all(self) -> None:
        """The server answers every layer in priority order; each forward waits for its own."""
        for spec in self.specs:
            raw = wire.empty_header()
            self._wait([dist.irecv(raw, src=self.server, tag=wire.TAG_REPLY)], f"waiting for layer {spec.name}")
            h = wire.Header.decode(raw)
            if h.status == wire.REFUSED:
                raise ProtocolError(f"server rank {self.server} refused layer {spec.name} (see its log)")
            self._apply_reply(spec, h)
            self.last = {"staleness": max(self.last.get("staleness", 0), h.staleness)} if spec.index else {"staleness": h.staleness}
            self.global_pushes = max(self.global_pushes, h.step)
            self.paused_s += h.paused_us / 1e6
            self.ready[spec.index].set()

    def _apply_reply(self, spec: LayerSpec, h: wire.Header) -> None:
        view = self.values[spec.start : spec.start + spec.numel]
        body = torch.empty(h.payload)
        self._wait([dist.irecv(body, src=self.server, tag=wire.TAG_VALUES)], f"receiving layer {spec.name}")
        if h.flags & FLAG_REFRESH or spec.method != "sf":
            view.copy_(body[: spec.numel])
            if spec.method == "sf":
                self.momenta[spec.index].copy_(body[spec.numel :])
        else:  # replay the factor log: [rows, lr, scale, factors...] per update
            at = 0
            for _ in range(h.rows):
                rows, lr, scale = int(body[at]), float(body[at + 1]), float(body[at + 2])
                n = sf_size(spec, rows)
                g = sf_gradient(spec, body[at + 3 : at + 3 + n], rows, scratch(self._buffers, spec.index, spec.numel))
                if scale != 1.0:
                    g.mul_(scale)
                sgd_step(view, self.momenta[spec.index], g, lr, self.mu, self.wd)
                at += 3 + n
        self.versions[spec.index] = h.version

    # -- driving -------------------------------------------------------------------------------
    def refresh(self) -> None:
        """The first pull: every layer's values (and momentum for sf layers)."""
        for spec in self.specs:
            self.ready[spec.index].clear()
        for spec in self.specs:
            h = wire.Header(wire.OP_LAYER, self.rank, 0, fingerprint=self.fp, layer=spec.index,
                            method=METHOD_IDS[spec.method], flags=FLAG_REFRESH | (wire.FLAG_END_OF_STEP if spec.index == len(self.specs) - 1 else 0))
            self._wait([dist.isend(h.encode(), dst=self.server, tag=wire.TAG_HEADER)], "asking for values")
        self._receive_all()

    def _pull_flag(self, flag: int, what: str) -> None:
        raw = wire.empty_header()
        self._wait([dist.isend(wire.Header(wire.OP_PULL, self.rank, 0, fingerprint=self.fp, flags=flag).encode(),
                               dst=self.server, tag=wire.TAG_HEADER),
                    dist.irecv(raw, src=self.server, tag=wire.TAG_REPLY)], what)

    def hold(self) -> None:
        """Between steps (after `settle`): hold the job still for an evaluation, and fetch the
        server's current values."""
        self._pull_flag(wire.FLAG_HOLD, "holding the job for an evaluation")
        self.refresh()

    def release(self) -> None:
        self._pull_flag(wire.FLAG_RELEASE, "releasing the job after an evaluation")

    def begin_step(self, lr: float, step: int) -> None:
        self._raise()
        self.lr, self.step_no, self.pushed = lr, step, 0
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
        raw = wire.empty_header()
        self._wait([dist.isend(wire.Header(wire.OP_STOP, self.rank, 0, fingerprint=self.fp).encode(), dst=self.server,
                               tag=wire.TAG_HEADER), dist.irecv(raw, src=self.server, tag=wire.TAG_REPLY)], "stopping")


class LayerServer(Server):
    """Serves OP_LAYER messages: per-layer versions, policies per layer, replies in priority order."""

    def __init__(self, *args, specs: list[LayerSpec], **kw):
        super().__init__(*args, **kw)
        self.specs = specs
        self.layer_version = [0] * len(specs)
        self.logs = {s.index: deque() for s in specs if s.method == "sf"}  # (version after, entry tensor)
        self._scratch: dict[tuple, torch.Tensor] = {}  # (worker, layer) -> gradient buffer of an sf layer
        # the version each worker's copy of each layer has (None: never synced, send a refresh)
        self.known: dict[int, list] = {w: [None] * len(specs) for w in self.workers}
        self._staleness: dict[int, int] = {}  # the largest layer staleness of each worker's current step
        self._paused: dict[int, float] = {}  # seconds each worker's current step waited for an evaluation

    def _layer_payload(self, spec: LayerSpec, h: wire.Header) -> tuple[Optional[torch.Tensor], Optional[str]]:
        if h.flags & FLAG_REFRESH:
            return None, None if h.payload == 0 else "a refresh carries no payload"
        expected = {"dense": spec.numel, "fp16": spec.numel, "topk": 2 * h.rows,
                    "sf": sf_size(spec, h.rows) if spec.method == "sf" else -1}[spec.method]
        if h.method != METHOD_IDS[spec.method] or h.payload != expected or not 0 <= h.rows <= max(spec.numel, 1 << 16):
            return None, f"layer {spec.name}: {wire.METHODS.get(h.method, h.method)} payload {h.payload} does not match the plan"
        dtype = torch.float16 if spec.method == "fp16" else torch.float32
        buf = torch.empty(h.payload, dtype=dtype)
        self._recv(h.sender, (buf, wire.TAG_PAYLOAD, f"layer {spec.name}'s payload"))
        return buf, None

    def _apply_layer(self, worker: int, spec: LayerSpec, h: wire.Header, payload: torch.Tensor) -> None:
        s = self.shard
        view = s.values[spec.start : spec.start + spec.numel]
        mom = s.momentum[spec.start : spec.start + spec.numel]
        g = None
        if spec.method == "sf":  # rebuilt outside the lock, in this worker's own buffer
            g = sf_gradient(spec, payload, h.rows, scratch(self._scratch, (worker, spec.index), spec.numel))
        with s.cond:
            self._paused[worker] = self._paused.get(worker, 0.0) + self.await_release(worker)
            staleness = self.layer_version[spec.index] - h.version
            verdict = self.policy.judge(staleness)
            if verdict.apply:
                # the lr travels in the factor log as float32: apply exactly that value here too
                lr = float(torch.tensor(h.lr * verdict.lr_scale * self.push_share, dtype=torch.float32))
                if spec.method == "sf":
                    self.logs[spec.index].append((self.layer_version[spec.index] + 1,
                                                  torch.cat([torch.tensor([h.rows, lr, 1.0]), payload])))
                    while len(self.logs[spec.index]) > LOG_LIMIT:
                        self.logs[spec.index].popleft()
                elif spec.method == "topk":
                    g = torch.zeros(spec.numel).index_add_(0, payload[: h.rows].view(torch.int32).long(), payload[h.rows :])
                else:
                    g = payload.float()
                sgd_step(view, mom, g, lr, self.mu, self.wd)
                self.layer_version[spec.index] += 1
            if h.flags & wire.FLAG_END_OF_STEP:  # one push of the budget per worker step
                self.applied += int(verdict.apply)
                self.dropped += int(not verdict.apply)
                self.histogram[staleness] += 1
                if verdict.apply:
                    self.max_applied_staleness = max(self.max_applied_staleness, staleness)
                self.record(worker, h, staleness, verdict, wire.APPLIED if verdict.apply else wire.DROPPED,
                            sum(self.layer_version))
        self._staleness[worker] = max(self._staleness.get(worker, 0), staleness)

    def _reply_all(self, worker: int) -> None:
        """Every layer, in priority (forward) order: values, or the factors since the worker's copy."""
        for spec in self.specs:
            with self.shard.cond:
                version = self.layer_version[spec.index]
                since = self.known[worker][spec.index]
                flags = 0
                if spec.method == "sf" and since is not None:
                    log = [e for v, e in self.logs[spec.index] if v > since]
                    if len(log) == version - since:
                        body = torch.cat(log) if log else torch.empty(0)
                        rows = len(log)
                    else:
                        flags, rows = FLAG_REFRESH, 0
                else:
                    flags, rows = (FLAG_REFRESH if spec.method == "sf" else 0), 0
                if spec.method != "sf" or flags:
                    view = self.shard.values[spec.start : spec.start + spec.numel]
                    body = (torch.cat([view, self.shard.momentum[spec.start : spec.start + spec.numel]])
                            if spec.method == "sf" else view.clone())
                self.known[worker][spec.index] = version
                count = self.applied + self.dropped
            paused = self._paused.pop(worker, 0.0) if spec is self.specs[0] else 0.0  # told once per step
            h = wire.Header(wire.OP_REPLY, self.rank, 0, version=version, payload=body.numel(), layer=spec.index,
                            rows=rows, flags=flags, staleness=self._staleness.get(worker, 0), step=count,
                            paused_us=int(paused * 1e6))
            self._reply(worker, h, body)
        self._staleness[worker] = 0

    def requests(self, worker: int) -> None:
        raw = wire.empty_header()
        self._staleness.setdefault(worker, 0)
        while (h := self.next_request(worker, raw, max(self.layer_version))) is not None:
            if h.op == wire.OP_PULL and h.flags & (wire.FLAG_HOLD | wire.FLAG_RELEASE):
                self.hold(worker, h)  # the values follow by a refresh (LayeredClient.hold)
                self._reply(worker, wire.Header(wire.OP_REPLY, self.rank, 0), None)
                continue
            why = None if h.op == wire.OP_LAYER and 0 <= h.layer < len(self.specs) else f"op {h.op}, layer {h.layer}"
            payload = None
            if why is None:
                payload, why = self._layer_payload(self.specs[h.layer], h)
            if why is not None:  # sizes are checked against the plan here
                self.refuse(worker, h, why, False)
                self.failed[worker] = f"protocol violation: {why}"
                return
            if payload is not None:
                self._apply_layer(worker, self.specs[h.layer], h, payload)
            if h.flags & wire.FLAG_END_OF_STEP:
                self._reply_all(worker)
