"""How a model's parameters are laid out for the parameter servers.

All parameters, in model order, form one flat vector. By default server s owns the contiguous
range [bounds[s], bounds[s+1]) (equal sizes, so bytes are balanced), its "shard". In layer mode
the plan places whole layers on servers instead (`Layout.placed`): a server's shard is its
layers' tensors, concatenated in model order, since a layer sent as sufficient factors is rebuilt
whole by one server. On a worker the parameters and their gradients are views into two flat
buffers in model order, so a contiguous shard's values and gradient are views: pushing and
pulling copy nothing. The fingerprint (a hash of names, shapes, servers and placement) goes in
every message header, so a worker and a server with different layouts never mix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn as nn


class Piece(NamedTuple):
    """The part of one parameter tensor that lies in one shard."""

    name: str
    tensor_index: int
    start: int  # offset within the shard
    numel: int
    flat: int  # offset in the model's flat vector


@dataclass
class Layout:
    names: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]  # start of each tensor in the flat vector
    numel: int
    servers: int
    placement: Optional[tuple[int, ...]] = None  # server of each tensor (layer mode); None: contiguous shards

    @classmethod
    def of(cls, model: nn.Module, servers: int) -> "Layout":
        names, shapes, offsets, total = [], [], [], 0
        for n, p in model.named_parameters():
            names.append(n)
            shapes.append(tuple(p.shape))
            offsets.append(total)
            total += p.numel()
        return cls(names, shapes, offsets, total, servers)

    def placed(self, server_of: dict[str, int]) -> "Layout":
        """The same parameters with each tensor on the server `server_of[name]` gives."""
        missing = [n for n in self.names if n not in server_of]
        if missing:
            raise ValueError(f"no server placed for {missing[0]}")
        return Layout(self.names, self.shapes, self.offsets, self.numel, self.servers,
                      tuple(server_of[n] for n in self.names))

    def sizes(self) -> list[int]:
        return [int(torch.Size(s).numel()) for s in self.shapes]

    def bounds(self) -> list[int]:
        return [self.numel * s // self.servers for s in range(self.servers + 1)]

    def ranges(self, server: int) -> list[tuple[int, int]]:
        """The shard as (start, end) ranges of the flat vector, in order (adjacent tensors merged)."""
        if self.placement is None:
            b = self.bounds()
            return [(b[server], b[server + 1])]
        out: list[tuple[int, int]] = []
        for off, n, s in zip(self.offsets, self.sizes(), self.placement):
            if s != server:
                continue
            if out and out[-1][1] == off:
                out[-1] = (out[-1][0], off + n)
            else:
                out.append((off, off + n))
        return out

    @property
    def contiguous(self) -> bool:
        return all(len(self.ranges(s)) <= 1 for s in range(self.servers))

    def shard_range(self, server: int) -> tuple[int, int]:
        """The flat range of a contiguous shard."""
        r = self.ranges(server)
        if len(r) != 1:
            raise ValueError(f"server {server}'s shard is not one contiguous range")
        return r[0]

    def shard_numel(self, server: int) -> int:
        return sum(hi - lo for lo, hi in self.ranges(server))

    def local(self, server: int, flat: int) -> int:
        """Where flat position `flat` lies within the server's shard."""
        at = 0
        for lo, hi in self.ranges(server):
            if lo <= flat < hi:
                return at + flat - lo
            at += hi - lo
        raise ValueError(f"position {flat} is not on server {server}")

    def pieces(self, server: int) -> list[Piece]:
        out, at = [], 0
        for lo, hi in self.ranges(server):
            for i, (name, off, n) in enumerate(zip(self.names, self.offsets, self.sizes())):
                a, b = max(lo, off), min(hi, off + n)
                if a < b:
                    out.append(Piece(name, i, at + a - lo, b - a, a))
            at += hi - lo
        return out

    @property
    def fingerprint(self) -> int:
        h = hashlib.sha256()
        h.update(repr((self.names, self.shapes, self.servers, self.placement)).encode())
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


def gather(flat: torch.Tensor, layout: Layout, server: int) -> torch.Tensor:
    """The server's shard of a flat vector (a view when the shard is contiguous)."""
    r = layout.ranges(server)
    if len(r) == 1:
        return flat[r[0][0] : r[0][1]]
    return torch.cat([flat[lo:hi] for lo, hi in r]) if r else flat.new_empty(0)
