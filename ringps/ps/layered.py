"""Layer-aware transmission for the parameter servers (--layer-strategy auto), the worker side.

`LayeredClient`:
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
  (layers.py: `replay`), so the copy stays exactly the server's; a worker too far behind gets the
  values and momentum instead (a refresh).

The server side is layer_server.py; the planned layers and the factor arithmetic both use are
layers.py.
"""

from __future__ import annotations

import threading
import time
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
from ringps.ps.layers import METHOD_IDS, LayerSpec, replay
from ringps.ps.layout import Layout


class LayerPayload(NamedTuple):
    """One layer's message body: the tensor, and how to read it."""

    body: torch.Tensor
    rows: int  # sufficient factors: batch rows of (delta, x)
    k: int  # top-k: (index, value) pairs



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
