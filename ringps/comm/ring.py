"""Dense ring all-reduce over point-to-point ops (reduce-scatter, then all-gather).

Each of the N chunks is summed by exactly one rank and then copied around, so every rank ends
with the same bits (though not bitwise gloo's, whose summation order differs).
Bytes sent per rank: 2 (N-1)/N * size.
"""

from __future__ import annotations

import torch

from ringps.comm.p2p import Ring


def ring_allreduce(t: torch.Tensor, ring: Ring, name: str = "dense-ring", wire: torch.dtype | None = None) -> torch.Tensor:
    """Sum `t` (1-D) across the ring, in place; returns `t`.

    wire: the dtype chunks travel in (fp16, bf16); sums are still taken in t's dtype, and the
    owner of each summed chunk rounds it to the wire dtype too, so every rank ends with the same
    bits."""
    n = ring.size
    if n == 1:
        return t
    wire = wire or t.dtype
    chunks = list(torch.tensor_split(t, n))
    r = ring.rank
    buf = torch.empty(max(c.numel() for c in chunks), dtype=wire, device=t.device)
    for s in range(n - 1):  # reduce-scatter: afterwards rank r owns chunk (r + 1) % n
        send, recv = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        got = buf[: recv.numel()]
        ring.step(send.to(wire), got, f"ring all-reduce chunk (reduce-scatter step {s})", name)
        recv.add_(got)
    if wire != t.dtype:
        own = chunks[(r + 1) % n]
        own.copy_(own.to(wire))
    for s in range(n - 1):  # all-gather the summed chunks
        send, recv = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        got = buf[: recv.numel()]
        ring.step(send.to(wire), got, f"ring all-reduce chunk (all-gather step {s})", name)
        recv.copy_(got)
    return t
