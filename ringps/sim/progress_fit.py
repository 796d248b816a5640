"""The progress model's constants fitted from run folders (`ringps simulate --calibrate`).

- `factor`: per synchronous strategy, its steps to the target against allreduce's in the same
  setting and seed (ring-topk's as a sparse step's, on the share its cost model sent sparse);
- `staleness_a`: the price of an asynchronous push's staleness, from the parameter-server runs
  that reached the target: their pushes, each with its staleness, against allreduce's steps.

predict.py states how the two are used; calibrate.py reads the runs (`Measured`).
"""

from __future__ import annotations

import statistics
from typing import Optional

from ringps.sim.calibrate import Measured, plain
from ringps.sim.predict import push_worth


def fit_progress(runs: list[Measured]) -> dict[str, float]:
    """Per synchronous strategy, allreduce's steps to the target over its own, the same setting
    and seed; median over its runs (a variant's only where the plain strategy has none)."""
    ref = allreduce_steps(runs)
    ratios: dict[str, list[float]] = {}
    for strategy, ms in plain(runs).items():
        for m in ms:
            base = ref.get(setting(m))
            if not (base and m.steps_to_target) or strategy.startswith("ps-"):
                continue
            tail = m.options.tail_from if m.options is not None else None
            if tail is not None and m.steps_to_target > tail:  # reached in ring-topk's exact tail: two
                continue  # exchanges' progress mixed (predict.py weighs them apart)
            r, share = base / m.steps_to_target, m.extra.get("sparse_share")
            if share is not None:  # a sparse step's factor: r = 1 - share x (1 - factor), the
                # dense remainder taken at allreduce's progress (predict.py gives a 16-bit one fp16's)
                if share < 0.5:  # mostly dense: says little about a sparse step
                    continue
                r = 1 - (1 - r) / share
            ratios.setdefault(strategy, []).append(r)
    return {k: round(statistics.median(v), 3) for k, v in ratios.items()}


def fit_staleness(runs: list[Measured]) -> Optional[float]:
    """`staleness_a` of the progress model (an asynchronous push is worth 1 / N of a dense step
    x 1 / (1 + a x s) at staleness s, nothing when dropped): per asynchronous parameter-server run
    that reached the target, the `a` at which its measured staleness histogram and drops make
    its pushes to the target worth the dense steps allreduce needed in the same setting and seed
    (a 1-D search: the worth falls as `a` grows); the median over runs. None: no such run."""
    ref = allreduce_steps(runs)
    fits = []
    for m in runs:
        base, reach = ref.get(setting(m)), m.extra.get("to_target") or {}
        hist, pushes = reach.get("histogram"), reach.get("pushes")
        if m.strategy == "ps-sync" or not m.strategy.startswith("ps-") or not (base and pushes and hist):
            continue
        kept = 1 - reach.get("dropped", 0) / pushes
        need = base * m.workers / pushes  # what the pushes to the target were worth, each
        if need >= push_worth(hist, kept, 0.0):
            fits.append(0.0)  # no slower than synchronous pushes: staleness cost nothing
        elif push_worth(hist, kept, A_MAX) < need:
            lo, hi = 0.0, A_MAX
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if push_worth(hist, kept, mid) > need else (lo, mid)
            fits.append(lo)
        # else: slower than any price of staleness explains (drops, or every push fresh)
    return round(statistics.median(fits), 4) if fits else None


A_MAX = 100.0  # the search's ceiling: a push 1 behind worth under 1% of a fresh one


def setting(m: Measured) -> tuple:
    """What a run is compared with allreduce's on: link, slowdown, workers, seed."""
    return m.net, str(m.slowdown), m.workers, m.seed


def allreduce_steps(runs: list[Measured]) -> dict[tuple, int]:
    """The allreduce runs' steps to the target, by setting."""
    return {setting(m): m.steps_to_target for m in runs if m.strategy == "allreduce"}
