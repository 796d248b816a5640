"""How a model's parameters are laid out for the parameter servers.

All parameters, in model order, form one flat vector. Server s owns the contiguous range
[bounds[s], bounds[s+1]) (equal sizes, so bytes are balanced), its "shard", which travels in
slices of at most `slice_size` entries. On a worker the parameters and their gradients are views
into two flat buffers in this order, so a shard's values and gradient are contiguous views:
pushing and pulling copy nothing. The fingerprint (a hash of names, shapes, servers and slice
size) goes in every message header, so a worker and a server with different layouts never mix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn


class Piece(NamedTuple):
    """The part of one parameter tensor that lies in one shard."""

    name: str
    tensor_index: int
    start: int  # offset within the shard
    numel: int


@dataclass
class Layout:
    names: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]  # start of each tensor in the flat vector
    numel: int
    servers: int
    slice_size: int

    @classmethod
    def of(cls, model: nn.Module, servers: int, slice_size: int = 1 << 20) -> "Layout":
        names, shapes, offsets, total = [], [], [], 0
        for n, p in model.named_parameters():
            names.append(n)
            shapes.append(tuple(p.shape))
            offsets.append(total)
            total += p.numel()
        return cls(names, shapes, offsets, total, servers, slice_size)

    def bounds(self) -> list[int]:
        return [self.numel * s // self.servers for s in range(self.servers + 1)]

    def shard_range(self, server: int) -> tuple[int, int]:
        b = self.bounds()
        return b[server], b[server + 1]

    def shard_numel(self, server: int) -> int:
        lo, hi = self.shard_range(server)
        return hi - lo

    def slices(self, server: int) -> list[tuple[int, int]]:
        """(offset within the shard, numel) of each bounded slice."""
        n = self.shard_numel(server)
        return [(o, min(self.slice_size, n - o)) for o in range(0, n, self.slice_size)] or [(0, 0)]

    def pieces(self, server: int) -> list[Piece]:
        lo, hi = self.shard_range(server)
        out = []
        for i, (name, off, shape) in enumerate(zip(self.names, self.offsets, self.shapes)):
            n = int(torch.Size(shape).numel())
            a, b = max(lo, off), min(hi, off + n)
            if a < b:
                out.append(Piece(name, i, a - lo, b - a))
        return out

    @property
    def fingerprint(self) -> int:
        h = hashlib.sha256()
        h.update(repr((self.names, self.shapes, self.servers, self.slice_size)).encode())
        return int.from_bytes(h.digest()[:8], "little") & ((1 << 62) - 1)

    def sample_positions(self, server: int, fraction: float, minimum: int = 64, seed: int = 0) -> list[torch.Tensor]:
        """VSGD's fixed pseudo-random coordinates, per tensor piece of the shard (positions within
        the shard, sorted). Server and worker derive the same ones from the layout alone."""
        out = []
        for piece in self.pieces(server):
            m = min(piece.numel, max(minimum, int(round(fraction * piece.numel))))
            g = torch.Generator().manual_seed((self.fingerprint + 7_919 * piece.tensor_index + seed) % (1 << 62))
            pos = torch.randperm(piece.numel, generator=g)[:m].sort().values
            out.append(pos + piece.start)
        return out


def flatten_into(model: nn.Module, layout: Layout) -> tuple[torch.Tensor, torch.Tensor]:
    """Make every parameter (and its .grad) a view into one flat values (and grads) buffer, in
    layout order; returns (values, grads). The current parameter values are kept."""
    params = list(model.parameters())
    device, dtype = params[0].device, params[0].dtype
    values = torch.empty(layout.numel, device=device, dtype=dtype)
    grads = torch.zeros(layout.numel, device=device, dtype=dtype)
    for p, off in zip(params, layout.offsets):
        n = p.numel()
        values[off : off + n].copy_(p.data.reshape(-1))
        p.data = values[off : off + n].view_as(p)
        p.grad = grads[off : off + n].view_as(p)
    return values, grads
