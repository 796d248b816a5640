"""Closed-form alpha-beta times of the collectives each strategy runs (no per-message events, so
1,024 workers cost nothing more than 4). A message of b bytes costs latency + b / bandwidth.

With nodes of G workers (`node_size`) joined by a faster intra-node link, a dense all-reduce runs
hierarchically, as NCCL does: reduce-scatter inside the node, ring all-reduce across nodes,
all-gather inside the node. A node has one link (`net`), which its G workers share: each runs the
inter-node ring for its 1/G of the bytes, all G at once through the node's link, so the link
carries what one ring of the whole message would (2 (nodes-1)/nodes x bytes). Counting each
worker's 1/G at the full link rate, as an earlier version did, made the inter-node phase G times
too short (VGG-16 on 128 nodes of 4 P100s: 97% efficiency predicted against 68% published).
"""

from __future__ import annotations

import math

from ringps.sim.cluster import ClusterSpec


def ring_allreduce_s(nbytes: float, n: int, bw: float, lat: float) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * lat + 2 * (n - 1) / n * nbytes / bw


def allreduce_s(nbytes: float, c: ClusterSpec) -> float:
    """Dense all-reduce of `nbytes` over all workers (hierarchical with nodes)."""
    g = min(c.node_size, c.workers)
    if g <= 1:
        return ring_allreduce_s(nbytes, c.workers, c.bw, c.latency_s)
    nodes = math.ceil(c.workers / g)
    intra = 2 * ((g - 1) * c.latency_s + (g - 1) / g * nbytes / c.intra_bw)  # reduce-scatter + all-gather
    # G rings of nbytes/G each, side by side through the node's one link at bw/G apiece
    return intra + ring_allreduce_s(nbytes / g, nodes, c.bw / g, c.latency_s)


def allgather_s(nbytes_each: float, c: ClusterSpec) -> float:
    """Ring all-gather: every worker ends with every worker's `nbytes_each`."""
    n = c.workers
    if n <= 1:
        return 0.0
    return (n - 1) * c.latency_s + (n - 1) * nbytes_each / c.bw
