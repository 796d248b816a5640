"""The progress model's constants fitted from run folders (`ringps simulate --calibrate`).

- `factor`: per synchronous strategy, its steps to the target against allreduce's in the same
  setting and seed (ring-topk's as a sparse step's, on the share its cost model sent sparse);
- `sparse`: per exchange, the same from ring-topk's runs that sent through that one exchange;
- `dense_steps`, `workers_ref`, `noise_batch`: allreduce's steps to the target, and with two or
  more worker counts the gradient noise scale that moves them with the workers;
- `staleness_a`: the price of an asynchronous push's staleness, from the parameter-server runs
  that reached the target: their pushes, each with its staleness, against allreduce's steps,
  for a stated form of the discount (`staleness_errors`: how well it holds, run by run).

predict.py states how the two are used; calibrate.py reads the runs (`Measured`).
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

from ringps.sim.calibrate import Measured, plain
from ringps.sim.predict import STALENESS_FORMS, push_worth


def fit_progress(runs: list[Measured]) -> dict[str, float]:
    """Per synchronous strategy, allreduce's steps to the target over its own, the same setting
    and seed; median over its runs (a variant's only where the plain strategy has none)."""
    ref = allreduce_steps(runs)
    ratios: dict[str, list[float]] = {}
    for strategy, ms in plain(runs).items():
        if strategy.startswith("ps-"):
            continue
        for m in ms:
            r = step_progress(m, ref, m.extra.get("sparse_share"))
            if r is not None:
                ratios.setdefault(strategy, []).append(r)
    return {k: round(statistics.median(v), 3) for k, v in ratios.items()}


def fit_sparse(runs: list[Measured]) -> dict[str, float]:
    """Per sparse exchange, a sparse step's progress through it (`Progress.sparse`): from ring-topk's
    runs whose sparse buckets went through that one exchange (`Measured.extra["sparse_exchange"]`:
    at least 80% of them, as with `exchange=NAME`), allreduce's steps to the target over theirs, the
    same setting and seed, on the share sent through it (the rest taken at a dense step's progress,
    as benchmarks/sparse_progress.py takes it); the median over each exchange's runs."""
    ref, ratios = allreduce_steps(runs), {}
    for m in runs:
        name = m.extra.get("sparse_exchange")
        if m.strategy == "ring-topk" and name and m.extra.get("sparse_exchange_share"):
            r = step_progress(m, ref, m.extra["sparse_exchange_share"])
            if r is not None:
                ratios.setdefault(name, []).append(r)
    return {k: round(statistics.median(v), 3) for k, v in sorted(ratios.items())}


def step_progress(m: Measured, ref: dict[tuple, int], share: Optional[float]) -> Optional[float]:
    """A run's step against a dense one: allreduce's steps to the target (`ref`, by setting) over
    its own, as a sparse step's on `share` where one is given. None where the run says nothing of
    it: no allreduce run or target reached, reached in ring-topk's exact tail (two exchanges'
    progress mixed: predict.py weighs them apart), or mostly dense (share under 0.5)."""
    base = ref.get(setting(m))
    if not (base and m.steps_to_target):
        return None
    tail = m.options.tail_from if m.options is not None else None
    if tail is not None and m.steps_to_target > tail:
        return None
    r = base / m.steps_to_target
    if share is None:
        return r
    return sparse_factor(r, share) if share >= 0.5 else None


def sparse_factor(ratio: float, share: float) -> float:
    """A sparse step's progress from a run's (allreduce's steps over its own) that sent `share` of
    its buckets sparse: ratio = 1 - share x (1 - factor), the dense remainder taken at allreduce's
    progress (predict.py gives a 16-bit one fp16's)."""
    return 1 - (1 - ratio) / share


def fit_staleness(runs: list[Measured], form: str = "linear") -> Optional[float]:
    """`staleness_a` of the progress model (an asynchronous push is worth 1 / N of a dense step
    x 1 / (1 + a x g(s)) at staleness s, g the stated `form`, nothing when dropped): over the
    asynchronous parameter-server runs that reached the target beside an allreduce run of the
    same setting and seed, the `a` whose predicted pushes (allreduce's steps x N, over the worth
    of a push with each run's own staleness histogram and drops) best match the measured ones, in
    least squares of their logs. One fit over every run, not a median of each run's own `a`: a
    run at 2 workers, whose pushes are ~1 behind, turns a 10% shortfall into a = 0.1, one at 12
    into 0.01, so per-run `a`s scatter by worker count where the pushes they predict do not.
    None: no such run (or only runs whose pushes were all fresh: they say nothing of it)."""
    pairs = [(h, kept, need) for _, h, kept, need in async_reached(runs) if set(h) != {0}]
    if not pairs:
        return None

    def loss(a: float) -> float:
        return sum((math.log(max(push_worth(h, kept, a, form), 1e-12)) - math.log(need)) ** 2 for h, kept, need in pairs)

    grid = [0.0] + [A_MAX * 10 ** (-6 + 6 * i / 240) for i in range(241)]  # 1e-4 .. 100, log-spaced
    i = min(range(len(grid)), key=lambda k: loss(grid[k]))
    if i == 0:
        return 0.0  # no slower than fresh pushes: staleness cost nothing
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    for _ in range(80):  # golden-section between the best grid point's neighbours
        m1, m2 = hi - (hi - lo) * 0.618, lo + (hi - lo) * 0.618
        lo, hi = (lo, m2) if loss(m1) <= loss(m2) else (m1, hi)
    return round((lo + hi) / 2, 4)


def staleness_fit(runs: list[Measured], form: str) -> tuple[dict, str]:
    """A calibration's staleness keys, and its line: `staleness_a` for the stated `form` (the
    shipped model's) and, as evidence for the form itself, every form's own `a` and how far its
    predicted pushes lie from the runs' (`staleness_fits`; to switch, set both keys). {}: no
    asynchronous run reached the target beside an allreduce one."""
    fits = {g: fit_staleness(runs, g) for g in STALENESS_FORMS}
    if fits[form] is None:
        return {}, "staleness_a the shipped model's (no asynchronous run reached the target beside an allreduce one)"

    def held(g: str) -> str:
        errs = [abs(e) for _, e in staleness_errors(runs, fits[g], g)]
        return f"a {fits[g]}, pushes off by median {statistics.median(errs):.0%}, at most {max(errs):.0%}"

    others = "; ".join(f"{g}: {held(g)}" for g in STALENESS_FORMS if g != form)
    return ({"staleness_a": fits[form], "staleness_form": form, "staleness_fits": fits},
            f"staleness_a {fits[form]} ({form}: {held(form)}; the form is stated, the others would give {others})")


def staleness_errors(runs: list[Measured], a: float, form: str = "linear") -> list[tuple[Measured, float]]:
    """Each asynchronous run that reached the target: its predicted pushes to it (allreduce's
    steps x N over a push's worth at its own staleness histogram and drops, at `a` and `form`)
    against its measured ones, as a ratio - 1."""
    return [(m, need / push_worth(h, kept, a, form) - 1) for m, h, kept, need in async_reached(runs)]


def async_reached(runs: list[Measured]) -> list[tuple[Measured, dict, float, float]]:
    """(run, staleness histogram, share of pushes kept, what each push was worth in 1 / N of a
    dense step) of every asynchronous parameter-server run that reached the target beside an
    allreduce run of the same setting and seed."""
    ref, out = allreduce_steps(runs), []
    for m in runs:
        base, reach = ref.get(setting(m)), m.extra.get("to_target") or {}
        hist, pushes = reach.get("histogram"), reach.get("pushes")
        if m.strategy != "ps-sync" and m.strategy.startswith("ps-") and base and pushes and hist:
            out.append((m, hist, 1 - reach.get("dropped", 0) / pushes, base * m.workers / pushes))
    return out


A_MAX = 100.0  # the search's ceiling: a push 1 behind worth under 1% of a fresh one


def setting(m: Measured) -> tuple:
    """What a run is compared with allreduce's on: link, slowdown, workers, seed."""
    return m.net, str(m.slowdown), m.workers, m.seed


def allreduce_steps(runs: list[Measured]) -> dict[tuple, int]:
    """The allreduce runs' steps to the target, by setting."""
    return {setting(m): m.steps_to_target for m in runs if m.strategy == "allreduce"}


def fit_dense_steps(runs: list[Measured]) -> dict:
    """The progress model's steps to the target from allreduce's runs that reached it:
    `workers_ref` (the worker count with the most runs, the smallest on a tie), `dense_steps`
    (their median) and, from two or more worker counts, `noise_batch` (McCandlish et al. 2018):
    steps = S_min + E_min / (batch x N) fitted by least squares over the runs, each at its own
    batch, B = E_min / S_min, and `dense_steps` the fitted curve's at the reference. No
    `noise_batch` where the fit has none (S_min or E_min not positive: steps fall as fast as the
    batch grows, or not at all). {}: no run reached it."""
    reached = [m for m in runs if m.strategy == "allreduce" and m.steps_to_target]
    if not reached:
        return {}
    ref = statistics.multimode(sorted(m.workers for m in reached))[0]
    out = {"workers_ref": ref, "dense_steps": float(statistics.median(m.steps_to_target for m in reached if m.workers == ref))}
    pts = [(1.0 / (m.batch * m.workers), m.steps_to_target) for m in reached]
    if len({x for x, _ in pts}) < 2:
        return out
    mx, my = statistics.fmean(x for x, _ in pts), statistics.fmean(y for _, y in pts)
    e_min = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    s_min = my - e_min * mx
    if s_min <= 0 or e_min <= 0:
        return out
    # the curve's own steps at the reference (its median alone would shift the whole curve)
    batch = statistics.median(m.batch for m in reached if m.workers == ref)
    return out | {"dense_steps": round(s_min + e_min / (batch * ref), 2), "noise_batch": round(e_min / s_min, 1)}
