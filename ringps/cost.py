"""The alpha-beta cost model shared by the exchange auto-selection, the layer planner and the
simulator.

A transfer of b bytes costs `latency + b / bandwidth` on the wire; the CPU work around it
(selection, scatter-adds, memory passes, reductions) costs per element, with constants measured
on this machine (`ringps.comm.probe.calibrate_cpu`); the model itself is pure arithmetic. An
exchange's cost is split into wire time, which can hide
behind the backward pass, and CPU time, which on a fully subscribed machine cannot.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import NamedTuple

B_IDX, B_VAL = 4, 4  # bytes per index and per fp32 value on the wire


# tc tbf's queue on every link of ringps's emulated cluster (launch/cluster.py), in seconds at the
# link's rate; the simulator reads it to tell whether the queue overflows (sim/calibrate.py)
EMULATED_QUEUE_S = 0.2


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
    prep_s: float = 0.0  # the part of cpu_s before the first message (the selection): the wire waits for it

    def exposed(self, overlap_s: float, cpu_share: float = 1.0) -> float:
        """Step time it adds when `overlap_s` of backward compute is left to hide the wire time."""
        return cpu_share * self.cpu_s + max(0.0, self.wire_s - overlap_s)


def ring_bytes(n_elems: float, N: int, b: int = B_VAL) -> float:
    return 2 * (N - 1) / N * n_elems * b
