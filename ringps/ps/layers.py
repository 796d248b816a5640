"""The planned layers of layer mode (--layer-strategy auto), shared by worker and server.

A `LayerSpec` is one planned layer: its module, where it lies in the flat parameter vector and in
its server's shard, and how it travels (dense, fp16, top-k, or sufficient factors for a fully
connected layer). A sufficient-factor update is (delta, x, bias gradient); `sf_gradient` rebuilds
the dense gradient from it, and `replay` applies logged updates through the server's own SGD step
(`sgd_step`), so a worker's copy of such a layer stays bit-identical to the server's.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ringps.ps import wire
from ringps.ps.layout import Layout
from ringps.ps.server import sgd_step

METHOD_IDS = {"dense": wire.DENSE, "fp16": wire.FP16, "topk": wire.TOPK, "sf": wire.SF}
ENTRY_HEAD = 4  # a log entry: [rows, lr, weight factor, bias factor, factors...]


def f32(x: float) -> float:
    """x as the float32 the factor log carries, so server and replaying worker use the same bits."""
    return float(torch.tensor(x, dtype=torch.float32))


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
