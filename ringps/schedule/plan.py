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
the priority (layers the next forward needs first come back first), and the partition (which
server shards hold the layer). `Plan.predict` gives the step time the cost model expects: an
asynchronous worker's step is bounded by its compute, by its own link, and by its share of the
server's link, which every worker crosses.
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
    servers: list[tuple[int, int]]  # (server, entries of this layer on it)
    up_bytes: float  # per worker step
    down_bytes: float
    cpu_s: float  # worker + server CPU the method adds per worker step
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
    notes: list[str] = field(default_factory=list)

    def totals(self) -> tuple[float, float, float]:
        return (sum(l.up_bytes for l in self.layers), sum(l.down_bytes for l in self.layers),
                sum(l.cpu_s for l in self.layers))

    def predict(self) -> dict[str, float]:
        """Predicted seconds per worker step, and what bounds it."""
        up, down, cpu = self.totals()
        n, s = self.workers, max(1, self.servers)
        own = up / self.worker_bps + down / self.worker_bps  # this worker's transfers, in turn
        # every worker crosses the servers' links; each server carries its share
        server = n * max(up, down) / (s * self.server_bps)
        msgs = (2 * len(self.layers) if self.overlap else 2) * self.latency_s
        compute = self.compute_s + cpu
        if self.overlap:
            # pushes leave during the backward and pulls land during the next forward: only the
            # part of the transfers that the compute cannot cover shows
            step = max(compute + msgs, server, own)
        else:
            step = max(compute + own + msgs, server)
        return {"step_s": step, "compute_s": compute, "own_link_s": own, "server_link_s": server}


def sf_eligible(lp: "LayerLike", batch: int) -> bool:
    return lp.kind == "fc" and lp.in_features > 0 and batch * (lp.in_features + lp.out_features) < lp.in_features * lp.out_features


class LayerLike:  # the fields of a profile layer that the planner reads
    kind: str
    in_features: int
    out_features: int


def method_cost(method: str, params: int, layer, batch: int, n: int, density: float, p: CostParams) -> Optional[tuple[float, float, float]]:
    """(up bytes, down bytes, cpu seconds) per worker step, or None when the method does not apply."""
    if method == "dense":
        return params * 4, params * 4, 3 * params * p.pass_s
    if method == "fp16":
        return params * 2, params * 4, 4 * params * p.pass_s
    if method == "topk":
        k = max(1, int(density * params))
        return k * 8, params * 4, params * (p.select_s + 2 * p.pass_s) + k * p.scatter_s
    if method == "sf":
        if not sf_eligible(layer, batch):
            return None
        factors = batch * (layer.in_features + layer.out_features) * 4 + layer.out_features * 4
        rebuild = batch * layer.in_features * layer.out_features * p.flop_s + 3 * params * p.pass_s
        # down: the factors of every update applied since this worker's last pull (about n);
        # cpu: the server rebuilds each gradient once, the worker replays each of the n updates
        return factors, n * factors, rebuild * (1 + n)
    raise KeyError(method)


def make_plan(profile: Profile, workers: int, servers: int, worker_bps: float, server_bps: Optional[float] = None,
              p: Optional[CostParams] = None, density: float = 0.01, methods: tuple[str, ...] = METHODS,
              contention: float = 1.0, shard_bounds: Optional[list[int]] = None, overlap: bool = True) -> Plan:
    """Choose each layer's method; `contention` scales the profiled compute to the real run
    (processes per core), `shard_bounds` are the servers' flat ranges (None: one server)."""
    p = p or CostParams(bandwidth=worker_bps)
    server_bps = server_bps or worker_bps
    layers, offset = [], 0
    bounds = shard_bounds or [0, sum(l.params for l in profile.layers)]
    for priority, lp in enumerate(profile.layers):
        span = (offset, offset + lp.params)
        offset += lp.params
        pieces = [(s, min(span[1], bounds[s + 1]) - max(span[0], bounds[s])) for s in range(len(bounds) - 1)
                  if min(span[1], bounds[s + 1]) > max(span[0], bounds[s])]
        best, best_t = "dense", math.inf
        for m in methods:
            if m == "sf" and len(pieces) > 1:
                continue  # the factors rebuild a whole weight: it must live on one server
            c = method_cost(m, lp.params, lp, profile.batch, workers, density, p)
            if c is None:
                continue
            up, down, cpu = c
            # the layer's share of the step: the busiest link it loads, plus its CPU
            t = max(workers * max(up, down) / (max(1, servers) * server_bps), (up + down) / worker_bps) + cpu
            if t < best_t:
                best, best_t = m, t
        up, down, cpu = method_cost(best, lp.params, lp, profile.batch, workers, density, p)
        layers.append(LayerPlan(lp.name, lp.kind, lp.params, best, priority, pieces, up, down, cpu,
                                lp.forward_s, lp.backward_s, lp.in_features, lp.out_features))
    return Plan(layers, workers, servers, worker_bps, server_bps, profile.step_s * contention, p.latency,
                overlap=overlap)


def dense_plan(profile: Profile, workers: int, servers: int, worker_bps: float, server_bps: Optional[float] = None,
               p: Optional[CostParams] = None, contention: float = 1.0) -> Plan:
    """What --layer-strategy off does: every layer dense, one push-pull after the backward."""
    return make_plan(profile, workers, servers, worker_bps, server_bps, p, methods=("dense",),
                     contention=contention, overlap=False)
