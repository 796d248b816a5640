"""Closed-form alpha-beta times of the collectives each strategy runs (no per-message events, so
1,024 workers cost nothing more than 4). A message of b bytes costs latency + b / bandwidth.

With nodes of G workers (`node_size`) joined by a faster intra-node link, a dense all-reduce runs
hierarchically, as NCCL does: reduce-scatter inside the node, ring all-reduce of each 1/G across
nodes, all-gather inside the node.
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
    return intra + ring_allreduce_s(nbytes / g, nodes, c.bw, c.latency_s)


def allgather_s(nbytes_each: float, c: ClusterSpec) -> float:
    """Ring all-gather: every worker ends with every worker's `nbytes_each`."""
    n = c.workers
    if n <= 1:
        return 0.0
    return (n - 1) * c.latency_s + (n - 1) * nbytes_each / c.bw
