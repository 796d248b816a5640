"""Choosing a strategy for the user: every strategy and its key setting, ranked by the simulator's
predicted time-to-accuracy (`ringps plan --auto`, `ringps train --strategy auto`).

The progress factors were measured at each strategy's default setting; a variant (another rank,
period or threshold) is priced with its strategy's factor, a stated assumption. Left out: ring-topk
below the measured density (its factor would make a sparser run look free) and DiLoCo (it trains
only with the paper's inner optimizer, which the choice does not set: SGD inside collapsed).

Candidates predicted within `resolution` of the fastest (5% by default: the simulator's held-out
step time lies a median 5.1% from the runs', docs/RESULTS.md §6) are ties to the model, and the
recommendation is the plainest update among them, the first in CANDIDATES' order: a near-tie
decided by the start-up measurement's noise flipped 4 workers at 1 Gbit/s from fp16 to PowerSGD,
1.18x slower in the runs (§6).

Without a calibration file auto prices the machine by the job's own step, timed at the start
(launch/measure.py), and by its DDP step among the same processes on loopback: `sync_wait` is what
that step took beyond the model's prediction of it, charged to every synchronous step
(ClusterSpec.sync_wait_s). Processes time-sharing cores reach the step's last collective unevenly,
which the model's fair sharing does not show; priced without it, the synchronous strategies' runs
took 1.08-1.25x the predicted step at 3-4 workers on loopback and at 1 Gbit/s, alike for every
synchronous strategy (a wait per step, not per byte), the parameter servers' 0.91-1.09x (§6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional

from ringps.cost import CostParams
from ringps.sim.cluster import ClusterSpec
from ringps.sim.engine import Options, Prediction
from ringps.sim.predict import Progress, simulate
from ringps.sim.workload import Workload

CANDIDATES: list[tuple[str, dict[str, Any]]] = [
    ("allreduce", {}), ("fp16", {}),
    *[("powersgd", {"powersgd_rank": r}) for r in (2, 4, 8)],
    ("ring-topk", {"density": 0.01}),
    ("topk-allgather", {"density": 0.01}),
    *[("localsgd", {"local_period": h}) for h in (4, 8, 16)],
    ("ps-async", {}), ("ps-stale-lr", {}), ("ps-vsgd", {}),
    *[("ps-threshold", {"staleness_threshold": t}) for t in (None, 2)],
]

RESOLUTION = 0.05  # config.StrategyConfig.auto_resolution's default


def label_of(strategy: str, settings: dict[str, Any]) -> str:
    s = ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None)
    return f"{strategy} ({s})" if s else strategy


# plainest first: DDP's all-reduce, 16 bits, low-rank, sparse, local steps, the parameter servers' staleness
PLAIN_ORDER = [label_of(s, o) for s, o in CANDIDATES]


def recommend(times: dict[str, float], resolution: float = RESOLUTION) -> str:
    """The label to recommend among predicted times-to-accuracy: the plainest (PLAIN_ORDER) of those
    within `resolution` of the fastest; the fastest where none is finite or resolution is 0."""
    best = min(times, key=times.get)
    if not math.isfinite(times[best]) or resolution <= 0:
        return best
    near = [k for k, t in times.items() if t <= times[best] * (1 + resolution)]
    return min(near, key=lambda k: (PLAIN_ORDER.index(k) if k in PLAIN_ORDER else len(PLAIN_ORDER), times[k]))


# the strategies whose exchanges select top-k entries, priced per element (ringps.cost): with
# CostParams's defaults an uncalibrated host's, with `rank`'s selection_cpu the hosts' measured ones
SELECTING = ("ring-topk", "topk-allgather")


@dataclass
class Choice:
    strategy: str
    settings: dict[str, Any]
    prediction: Prediction

    @property
    def tta(self) -> float:
        t = self.prediction.extra.get("time_to_accuracy_s")
        return math.inf if t is None else t

    def label(self) -> str:
        return label_of(self.strategy, self.settings)


def rank(w: Workload, c: ClusterSpec, prog: Progress, steps: int = 12, base: Optional[Options] = None,
         ps_cluster: Optional[ClusterSpec] = None, with_ps: bool = True,
         selection_cpu: Optional[CostParams] = None, resolution: float = RESOLUTION) -> list[Choice]:
    """Every candidate, the recommendation first (`recommend`: the plainest within `resolution`
    of the fastest), then fastest predicted time-to-accuracy first; `ps_cluster`: the cluster as a
    parameter-server worker computes on it (calibration fits its compute apart; under torchrun
    fewer workers, the servers among the ranks), default `c`; `with_ps`: the parameter servers too;
    `selection_cpu`: the per-element costs ring-topk's hook will measure on these hosts
    (`comm.probe.calibrate_cpu`), which price the selecting strategies' exchanges as the hook
    itself prices them (the rest keep `base`'s)."""
    base = base or Options()
    out = []
    for strategy, settings in CANDIDATES:
        on = ps_cluster if strategy.startswith("ps-") and ps_cluster is not None else c
        if strategy.startswith("ps-") and (on.workers < 2 or not with_ps):
            continue
        o = replace(base, **settings)
        if selection_cpu is not None and strategy in SELECTING:
            o = replace(o, cpu=selection_cpu)
        out.append(Choice(strategy, settings, simulate(strategy, w, on, o, prog, steps=steps)))
    out.sort(key=lambda ch: (ch.tta, ch.prediction.step_s))
    pick = recommend({ch.label(): ch.tta for ch in out}, resolution)
    return sorted(out, key=lambda ch: ch.label() != pick)  # stable: the rest stay fastest first


def sync_wait(step_s: float, loopback: ClusterSpec, w: Workload, prog: Progress) -> float:
    """Seconds per synchronous step that DDP's measured step `step_s` on `loopback` (the cluster of
    the processes that measured it, all-reducing among themselves) took beyond the model's
    all-reduce step there; 0 where the model is not short."""
    c = loopback.model_copy(update={"sync_wait_s": 0.0})
    return max(0.0, step_s - simulate("allreduce", w, c, Options(), prog, steps=12).step_s)


def seconds(s: float) -> str:
    """A predicted time to 3 significant figures, without an exponent: 4.66 s, 264 s, 47,900 s
    (whole seconds hid fp16's 4.66 against allreduce's 5.03 as 5 s and 5 s)."""
    if s >= 1000:
        return f"{float(f'{s:.3g}'):,.0f} s"
    return f"{s:.3g} s"


def reasons(choices: list[Choice]) -> str:
    best, runner = choices[0], (choices[1] if len(choices) > 1 else None)
    p = best.prediction
    if not math.isfinite(best.tta):  # no steps to the target known: `rank` fell back on the step
        return (f"{best.label()}: the shortest predicted step, {p.step_s:.3f} s ({p.utilization:.0%} utilization); "
                "no time-to-accuracy (the profile has no steps_to_target), so ranked by step time alone, which does "
                "not count the steps each strategy needs")
    why = (f"{best.label()}: predicted time-to-accuracy {seconds(best.tta)} (step {p.step_s:.3f} s, {p.utilization:.0%} "
           f"utilization, {p.bytes_per_step / 1e6:.1f} MB sent per step)")
    fastest = min(choices, key=lambda c: c.tta)
    if fastest.tta < best.tta:
        why += (f"; {fastest.label()} is predicted {seconds(fastest.tta)}, {best.tta / fastest.tta - 1:.1%} faster: within "
                f"the model's resolution (--auto-resolution), so the plainer update")
    elif runner is not None and math.isfinite(runner.tta):
        why += f"; next: {runner.label()} at {seconds(runner.tta)} ({runner.tta / best.tta:.2f}x)"
    dense = next((c for c in choices if c.strategy == "allreduce"), None)
    if dense is not None and math.isfinite(dense.tta) and dense is not best:
        why += f"; DDP all-reduce: {seconds(dense.tta)} ({dense.tta / best.tta:.2f}x)"
    return why
