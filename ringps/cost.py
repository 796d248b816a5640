"""The alpha-beta cost model shared by the exchange auto-selection, the layer planner and the
simulator.

A transfer of b bytes costs `latency + b / bandwidth` on the wire; the CPU work around it
(selection, scatter-adds, memory passes, reductions) costs per element, with constants measured
on this machine (`ringps.comm.probe.calibrate_cpu`); the model itself is pure arithmetic. An
exchange's cost is split into wire time, which can hide
behind the backward pass, and CPU time, which on a fully subscribed machine cannot.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import NamedTuple

B_IDX, B_VAL = 4, 4  # bytes per index and per fp32 value on the wire


@dataclass
class CostParams:
    bandwidth: float = 1.0e9  # bytes/s per link and direction
    latency: float = 1.0e-3  # s per message
    select_s: float = 5e-9  # per element scanned by the selector
    scatter_s: float = 20e-9  # per sparse entry scattered into a dense buffer
    pass_s: float = 1e-9  # per element of a dense memory pass (zero, copy, add, norms)
    reduce_s: float = 1e-9  # per element a collective sums on the CPU
    flop_s: float = 1e-10  # per multiply-add of a matrix product (sufficient factors)
    cpu_share: float = 1.0  # fraction of communication-thread CPU time that delays the step

    def as_dict(self) -> dict:
        return asdict(self)


def contention(processes: int, threads: int = 1) -> float:
    """How much slower one process computes when `processes` processes of `threads` threads each
    share this machine's cores (1 when every thread has a core). A profile measured by one process
    alone, times this, predicted the layer-aware steps within 20% (docs/RESULTS.md): the parameter
    server and the kernel's network stack take their share of the cores as the workers do."""
    return max(1.0, processes * threads / cores())


def cores() -> int:
    """The cores this process may run on (its affinity, which a container or taskset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Cost(NamedTuple):
    wire_s: float
    cpu_s: float
    bytes_sent: float  # per worker

    def exposed(self, overlap_s: float, cpu_share: float = 1.0) -> float:
        """Step time it adds when `overlap_s` of backward compute is left to hide the wire time."""
        return cpu_share * self.cpu_s + max(0.0, self.wire_s - overlap_s)


def ring_bytes(n_elems: float, N: int, b: int = B_VAL) -> float:
    return 2 * (N - 1) / N * n_elems * b


def exchange_cost(name: str, n: int, k: int, N: int, p: CostParams, block: int = 256, value_bytes: int = B_VAL) -> Cost:
    """Cost of summing one bucket of n entries with k selected per worker, over N workers; the
    sparse exchanges' values travel in `value_bytes` (2 with --value-dtype fp16/bf16)."""
    if N <= 1:
        return Cost(0.0, 0.0, 0.0)
    a, bw = p.latency, p.bandwidth
    if name == "dense":
        sent = ring_bytes(n, N)
        return Cost(2 * (N - 1) * a + sent / bw, ring_bytes(n, N, 1) * p.reduce_s + 2 * n * p.pass_s, sent)
    select = n * p.select_s + k * p.scatter_s
    if name in ("allgather", "gloo-allgather"):
        sent = (N - 1) * k * (B_IDX + value_bytes)
        msgs = 2 * (N - 1) if name == "allgather" else 2 * (N - 1) + (N - 1)
        cpu = select + N * k * p.scatter_s + 2 * n * p.pass_s
        return Cost(msgs * a + sent / bw, cpu, sent)
    if name == "shared-index":
        nb = math.ceil(n / block)
        sent = ring_bytes(nb + k, N, value_bytes)
        cpu = 3 * n * p.pass_s + nb * p.select_s * 8 + 2 * k * p.scatter_s + ring_bytes(nb + k, N, 1) * p.reduce_s
        return Cost(2 * (N - 1) * a + sent / bw, cpu, sent)  # one all-reduce: the scores ride with the values
    if name == "sparse-rs":
        seg = n / N
        d = min(1.0, k / n)
        sent, merged = 0.0, 0.0
        for j in range(1, N):  # partial sums grow by fill-in as segments travel
            nnz = seg * (1 - (1 - d) ** j)
            sent += min(nnz * (B_IDX + B_VAL), seg * B_VAL)
            merged += nnz
        final = seg * (1 - (1 - d) ** N)
        sent += (N - 1) * min(final * (B_IDX + B_VAL), seg * B_VAL)
        cpu = select + merged * p.scatter_s * 3 + 2 * n * p.pass_s
        return Cost(4 * (N - 1) * a + sent / bw, cpu, sent)
    raise KeyError(name)


SPARSE = ("allgather", "shared-index", "sparse-rs")


def choose_exchange(n: int, k: int, N: int, p: CostParams, overlap_s: float = 0.0,
                    candidates: tuple[str, ...] = ("dense",) + SPARSE, block: int = 256,
                    compute_s: float = 0.0, progress: float = 1.0, value_bytes: int = B_VAL) -> tuple[str, dict[str, float]]:
    """The exchange that adds the least step time, and every candidate's predicted cost.

    The model prices time per step; a sparse step also makes less progress than a dense one.
    With `progress` (what a sparse step achieves relative to a dense one) and `compute_s` (the
    compute this bucket's share of the step costs), a sparse exchange is chosen over dense only
    when its whole step per unit of progress is still shorter: (compute + sparse) / progress <
    compute + dense. Where the two are priced close, dense wins."""
    costs = {c: exchange_cost(c, n, k, N, p, block, value_bytes if c != "sparse-rs" else B_VAL).exposed(overlap_s, p.cpu_share)
             for c in candidates}
    best = min(costs, key=costs.get)
    if "dense" in costs and best != "dense" and (compute_s + costs[best]) / progress >= compute_s + costs["dense"]:
        best = "dense"
    return best, costs
