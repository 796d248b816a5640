"""Processor sharing: how one step's phases play out when the workers share a host's cores.

ringps's own emulated cluster runs every worker as a process on one machine (here 2 cores for 4
workers). While all of them compute, each gets cores/processes of a core; while some wait on
the network or sleep (`--slowdown` stretches a step with a sleep, Stretch in strategies/base.py),
the others get more. A static contention factor cannot see that, and mispredicted the slow
cells of the validation grid by +50..+75% (docs/RESULTS.md §6): the fast workers' backward and the
slow worker's whole backward run with cores to spare.

A worker's step is a list of phases, each CPU work (seconds at a whole core) or a sleep; at any
moment every running CPU phase progresses at min(1, cores / running). The rates change only when
a phase ends, so the solution is piecewise constant with at most one piece per phase end; this is
that closed-form fluid model, not a discrete-event loop (the engine's SimPy events stay per step).
Without `cores` (a real cluster: a device per worker) every phase runs at rate 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

EPS = 1e-12


@dataclass
class Phase:
    cpu: bool  # CPU work (shared) or a sleep
    amount: float  # seconds at a whole core, or of sleep
    pieces: list[tuple[float, float, float]] = field(default_factory=list)  # (t0, t1, rate), once run
    start: float = 0.0
    end: float = 0.0

    def time_at(self, work: float) -> float:
        """When `work` of this phase's amount was done (a bucket's gradients ready mid-backward)."""
        done = 0.0
        for t0, t1, rate in self.pieces:
            if rate > 0 and done + (t1 - t0) * rate >= work - EPS:
                return t0 + max(0.0, work - done) / rate
            done += (t1 - t0) * rate
        return self.end


def share(steps: list[list[Phase]], cores: Optional[int], t0: float = 0.0) -> None:
    """Run every worker's phases from `t0` (in place: each phase gets its start, end and pieces)."""
    if not cores:  # a device per worker: back to back at rate 1 (and O(N) at 1,024 workers)
        for ph in steps:
            t = t0
            for p in ph:
                p.start, p.end, p.pieces = t, t + p.amount, [(t, t + p.amount, 1.0)]
                t = p.end
        return
    idx = [0] * len(steps)
    left = [ph[0].amount if ph else 0.0 for ph in steps]
    t = t0
    for ph in steps:
        if ph:
            ph[0].start = t0
    while True:
        for i, ph in enumerate(steps):  # close phases with nothing left (zero-length ones too)
            while idx[i] < len(ph) and left[i] <= EPS:
                ph[idx[i]].end = t
                idx[i] += 1
                if idx[i] < len(ph):
                    ph[idx[i]].start, left[i] = t, ph[idx[i]].amount
        running = [i for i in range(len(steps)) if idx[i] < len(steps[i])]
        if not running:
            return
        busy = sum(steps[i][idx[i]].cpu for i in running)
        rate = 1.0 if not cores or busy <= cores else cores / busy
        rates = {i: (rate if steps[i][idx[i]].cpu else 1.0) for i in running}
        dt = min(left[i] / rates[i] for i in running)
        for i in running:
            steps[i][idx[i]].pieces.append((t, t + dt, rates[i]))
            left[i] -= dt * rates[i]
        t += dt
