"""The layer-aware plan: per layer, how its gradient travels, when, and to which servers.

For every layer (a module with parameters) of a profile, `make_plan` picks the method with the
cost model:
- `dense`: fp32 up and down;
- `fp16`: half-precision gradient up, fp32 values down;
- `topk`: k = density * P (index, value) pairs up, with error feedback on the worker;
- `sf`: sufficient factors for a fully connected layer when batch*(in+out) < in*out (Poseidon):
  the worker sends (delta, x), the server applies delta^T x and keeps the factors of every update
  it applied; a pull returns the factors since the worker's version, which it replays through the
  same SGD step, so its copy stays exactly the server's;
the priority (layers the next forward needs first come back first), and the partition: with
several servers, whole layers are placed on servers (a layer sent as sufficient factors is
rebuilt by one server), the heaviest first onto the least loaded server, so the servers' links
and CPUs carry balanced shares of every step.

`Plan.predict` gives the step time the cost model expects. With wait-free pushes and priority
replies (overlap), a worker's step is its forward and backward plus what the next forward
cannot hide: the replies start when the step's last push is in, arrive in priority order over
the worker's link, and a sufficient-factor layer's reply is replayed (n updates, each a rebuild
and an SGD step) before that layer's forward can run; the forward of the layers before it
covers part of that. A reply also waits, on average, behind half the other workers' updates
that the server applies under the shard lock. The step is further bounded by the server's link,
which every worker crosses, by the worker's own link, and by the server's CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from ringps.cost import CostParams
from ringps.schedule.profile import Profile

METHODS = ("dense", "fp16", "topk", "sf")


@dataclass
class LayerPlan:
    name: str
    kind: str
    params: int
    method: str
    priority: int  # 0: needed first by the next forward
    server: int  # the server it is placed on
    up_bytes: float  # per worker step
    down_bytes: float
    cpu_s: float  # CPU the method adds to the worker's backward (encoding its gradient)
    replay_s: float = 0.0  # CPU to take in one reply (copy, or replay n factor updates), comm thread
    server_s: float = 0.0  # server CPU per push of this layer (decode, rebuild, SGD step)
    lock_s: float = 0.0  # the part of it under the shard lock (the SGD step)
    forward_s: float = 0.0
    backward_s: float = 0.0
    in_features: int = 0
    out_features: int = 0


@dataclass
class Plan:
    layers: list[LayerPlan]
    workers: int
    servers: int
    worker_bps: float  # bytes/s of each worker's link
    server_bps: float  # bytes/s of each server's link
    compute_s: float  # forward + backward per step under this machine's contention
    latency_s: float
    overlap: bool = True  # wait-free pushes and priority pulls (False: one push-pull after backward)
    even: bool = False  # shards are equal contiguous ranges (layer mode off), not placed layers
    notes: list[str] = field(default_factory=list)

    def totals(self) -> tuple[float, float, float]:
        return (sum(l.up_bytes for l in self.layers), sum(l.down_bytes for l in self.layers),
                sum(l.cpu_s for l in self.layers))

    def per_server(self, attr) -> list[float]:
        if self.even:
            total = sum(attr(l) for l in self.layers)
            return [total / max(1, self.servers)] * max(1, self.servers)
        out = [0.0] * max(1, self.servers)
        for l in self.layers:
            out[l.server] += attr(l)
        return out

    def predict(self) -> dict[str, float]:
        """Predicted seconds per worker step, and what bounds it."""
        up, down, cpu = self.totals()
        n = self.workers
        own = up / self.worker_bps + down / self.worker_bps  # this worker's transfers, in turn
        # every worker crosses the servers' links; the busiest server bounds the step
        server = n * max(max(u, d) for u, d in zip(self.per_server(lambda l: l.up_bytes),
                                                    self.per_server(lambda l: l.down_bytes))) / self.server_bps
        applies = sum(l.server_s for l in self.layers)  # server CPU per push
        server_cpu = n * max(self.per_server(lambda l: l.server_s))
        queue = (n - 1) / 2 * max(self.per_server(lambda l: l.lock_s))  # a reply waits behind half the others' updates
        compute = self.compute_s + cpu
        if self.overlap:
            # replies land in priority order; each layer's forward waits for its own (replayed) reply
            rate = min(self.worker_bps, self.server_bps)
            exposed, arrived, replayed, forward = 0.0, self.latency_s, 0.0, 0.0
            for l in sorted(self.layers, key=lambda l: l.priority):
                arrived += l.down_bytes / rate
                replayed = max(replayed, arrived) + l.replay_s  # one thread receives and replays
                exposed = max(exposed, replayed - forward)
                forward += l.forward_s
            exposed += queue + 2 * len(self.layers) * self.latency_s
            step = max(compute + exposed, server, own, server_cpu)
        else:
            exposed = own + 2 * self.latency_s + applies + queue + sum(l.replay_s for l in self.layers)
            step = max(compute + exposed, server, server_cpu)
        return {"step_s": step, "compute_s": compute, "exposed_s": exposed, "own_link_s": own,
                "server_link_s": server, "server_cpu_s": server_cpu}


def sf_eligible(lp: "LayerLike", batch: int) -> bool:
    return lp.kind == "fc" and lp.in_features > 0 and batch * (lp.in_features + lp.out_features) < lp.in_features * lp.out_features


class LayerLike:  # the fields of a profile layer that the planner reads
    kind: str
    in_features: int
    out_features: int


@dataclass
class MethodCost:
    up: float  # bytes per worker step
    down: float
    cpu: float  # seconds on the worker's backward
    replay: float  # seconds to take in the reply
    server: float  # server seconds per push
    lock: float  # the part of it under the shard lock


def method_cost(method: str, params: int, layer, batch: int, n: int, density: float, p: CostParams) -> Optional[MethodCost]:
    """What one worker step of this layer costs by `method`, or None when the method does not apply.
    The update and rebuild times come from the profile where it measured them."""
    update = getattr(layer, "update_s", 0.0) or 4 * params * p.pass_s
    if method == "dense":
        return MethodCost(params * 4, params * 4, params * p.pass_s, params * p.pass_s, update, update)
    if method == "fp16":
        return MethodCost(params * 2, params * 4, 2 * params * p.pass_s, params * p.pass_s, update + params * p.pass_s,
                          update)
    if method == "topk":
        k = max(1, int(density * params))
        return MethodCost(k * 8, params * 4, params * (p.select_s + 2 * p.pass_s) + k * p.scatter_s, params * p.pass_s,
                          update + params * p.pass_s + k * p.scatter_s, update + params * p.pass_s + k * p.scatter_s)
    if method == "sf":
        if not sf_eligible(layer, batch):
            return None
        factors = batch * (layer.in_features + layer.out_features) * 4 + layer.out_features * 4
        rebuild = getattr(layer, "rebuild_s", 0.0) or batch * layer.in_features * layer.out_features * p.flop_s
        # down: the factors of every update applied since this worker's last pull (about n), each
        # replayed: rebuilt and stepped; the server rebuilds and steps each push once
        return MethodCost(factors, n * factors, 0.0, n * (rebuild + update), rebuild + update, update)
    raise KeyError(method)


def make_plan(profile: Profile, workers: int, servers: int, worker_bps: float, server_bps: Optional[float] = None,
              p: Optional[CostParams] = None, density: float = 0.01, methods: tuple[str, ...] = METHODS,
              contention: float = 1.0, overlap: bool = True) -> Plan:
    """Choose each layer's method and server; `contention` scales the profiled compute to the real
    run (processes per core)."""
    p = p or CostParams(bandwidth=worker_bps)
    server_bps = server_bps or worker_bps
    layers = []
    for priority, lp in enumerate(profile.layers):
        best, best_t = "dense", math.inf
        for m in methods:
            c = method_cost(m, lp.params, lp, profile.batch, workers, density, p)
            if c is None:
                continue
            # the layer's share of the step: the busiest link it loads, plus its CPU
            t = max(workers * max(c.up, c.down) / (max(1, servers) * server_bps), (c.up + c.down) / worker_bps,
                    workers * c.server / max(1, servers) * contention) + (c.cpu + c.replay) * contention
            if t < best_t:
                best, best_t = m, t
        c = method_cost(best, lp.params, lp, profile.batch, workers, density, p)
        layers.append(LayerPlan(lp.name, lp.kind, lp.params, best, priority, 0, c.up, c.down,
                                c.cpu * contention, c.replay * contention, c.server * contention, c.lock * contention,
                                lp.forward_s * contention, lp.backward_s * contention, lp.in_features, lp.out_features))
    place(layers, servers, workers, server_bps)
    return Plan(layers, workers, servers, worker_bps, server_bps, profile.step_s * contention, p.latency,
                overlap=overlap)


def place(layers: list[LayerPlan], servers: int, workers: int, server_bps: float) -> None:
    """Whole layers onto servers, heaviest first onto the least loaded (longest-processing-time
    first): a layer's load is its share of a server's link per step plus its server CPU."""
    load = [0.0] * max(1, servers)
    for l in sorted(layers, key=lambda l: -(workers * max(l.up_bytes, l.down_bytes) / server_bps + workers * l.server_s)):
        s = min(range(len(load)), key=lambda i: (load[i], i))
        l.server = s
        load[s] += workers * max(l.up_bytes, l.down_bytes) / server_bps + workers * l.server_s


def dense_plan(profile: Profile, workers: int, servers: int, worker_bps: float, server_bps: Optional[float] = None,
               p: Optional[CostParams] = None, contention: float = 1.0) -> Plan:
    """What --layer-strategy off does: every layer dense, one push-pull after the backward."""
    plan = make_plan(profile, workers, servers, worker_bps, server_bps, p, methods=("dense",),
                     contention=contention, overlap=False)
    plan.even = True
    return plan
