"""From a step-time prediction to time-to-accuracy, and one call for a whole prediction.

The progress model (stated, calibrated from runs, open to the user's own: `--progress FILE`):
- a dense synchronous run needs `dense_steps` steps to the target at `workers_ref` workers; at
  N workers, with `noise_batch` B (the gradient noise scale, McCandlish et al. 2018, "An
  Empirical Model of Large-Batch Training"), steps at a global batch of b x N samples are
  S_min x (1 + B / (b x N)): a larger batch saves steps while it is small against B and stops
  saving them past it. Without B (a profile that does not state it), samples to the target are
  taken as constant (the linear-scaling regime, B infinite): dense_steps x workers_ref / N;
- a strategy's step makes `factor[strategy]` of a dense step's progress (sparse updates, low-rank,
  local steps between averages: measured as the ratio of steps to the target); for ring-topk the
  factor is a sparse step's through its chosen exchanges: the progress file's measured one per
  exchange and worker count (`sparse`), else the exchange's own (`Exchange.progress`, the constant
  the hook chooses with), unless the file names one for ring-topk itself; applied to the share of
  its selectable parameters the cost model sends sparse
  (share x factor + (1 - share) x dense): buckets it sends whole progress as the DDP strategy
  whose all-reduce that is (fp32: allreduce's factor, 16 bits: fp16's);
- ring-topk's exact tail (a run's last `exact_tail` of its `total_steps`, where the run's length
  is given): steps there take the faithful exchanges' time and make their progress;
- an asynchronous push is one worker's batch at 1 / N of the learning rate, worth 1 / N of a
  dense step at N workers (the steps above), times
  1 / (1 + staleness_a x g(s)) at staleness s, g the stated `staleness_form` (s, sqrt(s) or
  ln(1 + s); `a` is fitted for it, the form is not: runs at 2-12 workers fit all three, which
  part far apart at hundreds, docs/RESULTS.md); a dropped push is worth nothing. Every worker's
  first push counts once (its staleness runs from the common start), the rest at the worth and
  rate of the simulated pushes after them: the prediction does not hang on how many pushes per
  worker the simulator ran.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Callable, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ringps.errors import ConfigError
from ringps.sim import trace_out
from ringps.sim.cluster import ClusterSpec
from ringps.sim.engine import ITEMISED_CPU, PS, Options, Prediction, run_sync
from ringps.sim.ps import run_ps
from ringps.sim.workload import PROFILES, Workload, load_yaml_model

# g(s) of a push's discount 1 / (1 + staleness_a x g(s)) at staleness s
STALENESS_FORMS: dict[str, Callable[[float], float]] = {"linear": float, "sqrt": math.sqrt, "log": math.log1p}


class Progress(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = ""
    workers_ref: int = Field(4, ge=1)
    dense_steps: Optional[float] = Field(None, gt=0)  # None: the workload's steps_to_target
    factor: dict[str, float] = {}
    staleness_a: float = Field(0.1, ge=0)
    staleness_form: Literal["linear", "sqrt", "log"] = "linear"  # g(s): stated, not fitted
    # calibration: `staleness_a` fitted for each form (informational: to switch, set both keys)
    staleness_fits: dict[str, float] = {}
    # the gradient noise scale in samples (calibrated from allreduce runs at two or more worker
    # counts); None: the profile's, else linear scaling
    noise_batch: Optional[float] = Field(None, gt=0)
    compute_a: Optional[float] = None  # calibration: measured compute = a x profile per whole core (informational)
    efficiency: Optional[float] = None  # calibration: payload per configured link bit (informational)
    server_efficiency: Union[dict[str, float], float, None] = None  # calibration: the servers' links', per link (informational)
    cpu_per_byte: Optional[float] = None  # calibration: CPU seconds per byte a worker moved (informational)
    ps_compute_a: Optional[float] = None  # calibration: a parameter-server worker's compute_a (informational)
    jitter: Optional[float] = None  # calibration: the compute's step-to-step log sd (informational)
    # calibration: the forward's and optimizer step's shares of a synchronous worker's compute per step
    forward_share: Optional[float] = Field(None, gt=0, lt=1)
    optimizer_share: Optional[float] = Field(None, ge=0, lt=1)
    # calibration: per strategy, CPU seconds per step of its own work the model does not itemise,
    # on the calibrated machine and model (Options.extra_cpu_s); empty in the shipped file
    cpu_s: dict[str, float] = {}
    # calibration: the strategies whose own CPU the model itemised when cpu_s was fitted (a file
    # without them, from before 2026-12-07, fitted PowerSGD's products into cpu_s)
    cpu_s_itemised: list[str] = []
    # calibration: workers -> each direction of a server's lossy link while both carry transfers,
    # x its rate (measured apart by benchmarks/server_link.py, `--calibrate ... --duplex`); empty: 1
    duplex: dict[int, float] = {}

    # a sparse step's progress through each of ring-topk's exchanges, measured (by worker count:
    # the nearest measured count at or below, else the smallest), in place of the exchange's own
    # constant (`Exchange.progress`, which the hook chooses with); absent: the exchange's own
    sparse: dict[str, Union[float, dict[int, float]]] = {}

    def steps_factor(self, strategy: str) -> float:
        return self.factor.get(strategy, 1.0)

    def sparse_at(self, exchange: str, workers: Optional[int], own: float) -> float:
        """A sparse step's progress through `exchange` at `workers` workers: the file's, else `own`."""
        v = self.sparse.get(exchange)
        if v is None or isinstance(v, (int, float)):
            return own if v is None else float(v)
        below = [k for k in v if workers is not None and k <= workers]
        return v[max(below)] if below else v[min(v)]


def load_progress(path: Optional[str], flag: str = "--progress") -> Progress:
    p = Path(path) if path else PROFILES / "progress.yaml"
    if not p.is_file():
        raise ConfigError(f"{flag} {path}: no such file" + (
            "" if flag == "--progress" else " (write one with `ringps simulate --calibrate RUN... --out FILE`)"))
    prog = load_yaml_model(Progress, p, f"{flag} {path or p}")
    # an older file's cpu_s of a strategy the model now itemises was that CPU: the itemised price replaces it
    return prog.model_copy(update={"cpu_s": {k: v for k, v in prog.cpu_s.items()
                                             if k not in ITEMISED_CPU or k in prog.cpu_s_itemised}})


def load_calibration(path: Optional[str], flag: str) -> Progress:
    """A calibration file over the shipped progress model: its own progress where it fitted it
    (factors of the strategies it ran; steps to the target where its runs reached it; the price of
    staleness where its asynchronous runs did), the shipped model's elsewhere; no file: the
    shipped model."""
    shipped = load_progress(None)
    if not path:
        return shipped
    calibrated = load_progress(path, flag)
    update: dict = {"factor": {**shipped.factor, **calibrated.factor}, "sparse": {**shipped.sparse, **calibrated.sparse}}
    if calibrated.dense_steps is None:
        update |= {"workers_ref": shipped.workers_ref, "dense_steps": shipped.dense_steps}
    if "staleness_a" not in calibrated.model_fields_set:  # the price and its form go together
        update |= {"staleness_a": shipped.staleness_a, "staleness_form": shipped.staleness_form}
    return calibrated.model_copy(update=update)


def push_worth(hist: dict[int, int], kept: float, staleness_a: float, form: str = "linear") -> float:
    """A mean asynchronous push's worth, in 1 / N of a dense step: 1 / (1 + staleness_a x g(s))
    over the staleness histogram (g: `form`, STALENESS_FORMS), times the share of pushes `kept`
    (a dropped one is worth nothing)."""
    g, total = STALENESS_FORMS[form], sum(hist.values()) or 1
    return kept * sum(v / (1 + staleness_a * g(int(s))) for s, v in hist.items()) / total


def pushes_to_target(extra: dict, need: float, staleness_a: float, form: str = "linear") -> Optional[float]:
    """Asynchronous pushes to `need` fresh batches: every worker's first push once (its staleness
    counts from the common start, so at N workers the first round spreads over 0..N-1 and is
    worth far more than the steady state's pushes at ~N-1), then pushes at the steady state's
    worth. The simulated run has few pushes per worker at scale (8 at 1,024 workers), where a run
    to the target has tens: averaging its whole histogram weighed the first round an eighth and
    made time-to-accuracy ~20% short. None: no push is kept."""
    hist = extra.get("staleness_histogram", {})
    total, kept = sum(hist.values()), 1 - extra.get("drop_fraction", 0.0)
    first = extra.get("first_round", {})
    fh = first.get("histogram", {})
    n_first = sum(fh.values())
    steady = {s: v - fh.get(s, 0) for s, v in hist.items() if v > fh.get(s, 0)}
    n_steady = total - n_first
    if not n_first or not n_steady:  # no first round recorded, or nothing after it: the whole histogram
        value = push_worth(hist, kept, staleness_a, form)
        return need / value if value > 0 else None
    got = push_worth(fh, 1 - first.get("dropped", 0) / n_first, staleness_a, form) * n_first
    if got >= need:  # the first round alone gets there (a handful of batches' target)
        return need / (got / n_first)
    steady_kept = (kept * total - (n_first - first.get("dropped", 0))) / n_steady
    value = push_worth(steady, steady_kept, staleness_a, form)
    return n_first + (need - got) / value if value > 0 else None


def push_time(pred: Prediction, pushes: float) -> float:
    """Seconds to `pushes` pushes: the simulated start (every worker's first compute, its pushes
    bunched at the servers) until as many pushes as workers are in, then the rate the simulated
    run kept after it. (The run's mean rate counts the start's idle compute once in its few pushes
    per worker at scale, where a run to the target has tens: 20% slower at 256 workers, 4 each.)"""
    n, first = pred.workers, pred.extra.get("first_round", {})
    total = sum(pred.extra.get("staleness_histogram", {}).values())
    until, end = first.get("until_s", 0.0), first.get("run_s", 0.0)
    if pushes <= n or total <= n or end <= until:  # the run ended in its start: its mean rate
        return pushes / (pred.extra.get("pushes_per_s") or n / pred.step_s)
    return until + (pushes - n) * (end - until) / (total - n)


def noise_scale(w: Workload, prog: Progress) -> Optional[float]:
    """The gradient noise scale in samples: the progress file's, else the profile's; None: neither
    states one (constant samples to the target)."""
    return prog.noise_batch if prog.noise_batch is not None else w.noise_batch


def dense_steps_at(workers: int, w: Workload, prog: Progress) -> Optional[float]:
    """Dense synchronous steps to the target at `workers` workers (None: no steps to the target
    known): the progress file's or the profile's steps at `workers_ref`, moved along the noise
    scale's curve S_min x (1 + B / batch) where one is known, else at constant samples."""
    dense = prog.dense_steps or w.steps_to_target
    if dense is None:
        return None
    noise = noise_scale(w, prog)
    if noise is None:
        return dense * prog.workers_ref / workers
    s_min = dense / (1 + noise / (w.batch * prog.workers_ref))
    return s_min * (1 + noise / (w.batch * workers))


def time_to_accuracy(pred: Prediction, w: Workload, prog: Progress) -> Optional[float]:
    n = pred.workers
    need = dense_steps_at(n, w, prog)  # in dense steps
    if need is None:
        return None
    if pred.strategy in PS and pred.strategy != "ps-sync":
        pushes = pushes_to_target(pred.extra, need * n, prog.staleness_a, prog.staleness_form)  # each: one batch of N
        if pushes is None:
            return None  # every push dropped: it never gets there
        return push_time(pred, pushes) / prog.steps_factor(pred.strategy)
    f = sync_factor(pred.strategy, pred.extra, prog, workers=n)
    steps = max(1.0, need / f)  # past the linear-scaling regime: one step at least
    tail, start = pred.extra.get("tail"), pred.extra.get("tail_from_step")
    before = steps if tail is None or steps <= start else start
    warm = min(before, pred.extra.get("warmup_steps", 0))
    t = warm * pred.extra.get("warmup_step_s", pred.step_s) + (before - warm) * pred.step_s
    if before < steps:  # the rest in ring-topk's exact tail, at its exchanges' step and progress
        t += (need - before * f) / sync_factor(pred.strategy, tail, prog, pred.extra, n) * tail["step_s"]
    return t


def sync_factor(strategy: str, extra: dict, prog: Progress, before: Optional[dict] = None,
                workers: Optional[int] = None) -> float:
    """A synchronous step's progress against a dense one: the strategy's factor; for ring-topk
    its sparse exchanges' on the share it sends sparse, DDP's on the rest. `before`: the steps
    before ring-topk's exact tail, where `extra` is the tail's: a factor the progress file names
    (measured on the run's main exchanges) moves by the exchanges' own ratio."""
    factor = prog.steps_factor(strategy)
    if "sparse_share" in extra:  # a sparse step's factor; buckets sent dense progress as dense ones
        if strategy not in prog.factor:  # ring-topk: its chosen exchanges' (the progress model's, else their own)
            factor = exchanges_progress(extra, prog, workers)
        elif before is not None:
            factor *= exchanges_progress(extra, prog, workers) / exchanges_progress(before, prog, workers)
        # a bucket sent whole makes DDP's update (fp32: allreduce's, 16 bits: fp16's): its factor
        as_ddp = extra.get("dense_as", {})
        whole = sum(prog.steps_factor(s) * v for s, v in as_ddp.items()) / sum(as_ddp.values()) if as_ddp else 1.0
        share = extra["sparse_share"]
        factor = share * factor + (1 - share) * whole
    return factor


def exchanges_progress(extra: dict, prog: Progress, workers: Optional[int]) -> float:
    """A sparse step's progress through the exchanges the engine chose, weighed by what each sent:
    the progress model's measured one for each (`Progress.sparse`), else the exchange's own."""
    by = extra.get("sparse_exchanges")
    if not by:
        return extra.get("sparse_progress", 1.0)
    total = sum(v["params"] for v in by.values())
    return sum(v["params"] * prog.sparse_at(k, workers, v["progress"]) for k, v in by.items()) / total


def warmup(strategy: str, w: Workload, c: ClusterSpec, o: Options) -> tuple[int, str, Options]:
    """How many steps a strategy spends in its warm-up, and what such a step is: PowerSGD's and
    post-local SGD's first steps are plain all-reduce; ring-topk's density falls from 0.25 to
    --density over its warm-up epochs (priced here at the ramp's geometric middle)."""
    if strategy == "powersgd":
        return o.powersgd_start_iter, "allreduce", o
    if strategy == "localsgd":
        return o.local_warmup_steps, "allreduce", o
    if strategy in ("ring-topk", "topk-allgather") and w.samples and o.density_warmup_epochs > 0:
        per_epoch = math.ceil(w.samples / (w.batch * c.workers))
        return round(o.density_warmup_epochs * per_epoch), strategy, replace(o, density=math.sqrt(0.25 * o.density))
    return 0, strategy, o


def scaled(w: Workload, c: ClusterSpec) -> Workload:
    """The profile on cluster `c`: its times x compute_scale and, where the cluster gives them (a
    calibration's), split between forward, backward and the optimizer's step in the cluster's
    shares; the layers keep their proportions within the forward and within the backward (the
    buckets' readiness). A profile's own split can be off where a run's is not: the shipped ones
    time the layers alone, and leave the optimizer out."""
    fx = bx = c.compute_scale
    opt = w.optimizer_s * c.compute_scale
    if c.forward_share is not None or c.optimizer_share is not None:
        total = (w.compute_s + w.optimizer_s) * c.compute_scale
        fwd = w.compute_s - w.backward_s
        opt = total * c.optimizer_share if c.optimizer_share is not None else opt
        fwd_s = total * c.forward_share if c.forward_share is not None else fwd * c.compute_scale
        fx = fwd_s / fwd if fwd else 0.0
        if total - fwd_s - opt <= 0:
            raise ConfigError(f"forward_share {c.forward_share} with the optimizer's {opt:.3g} s leaves {w.name}'s backward "
                              "no time: give shares that sum below 1")
        bx = (total - fwd_s - opt) / w.backward_s if w.backward_s else 0.0
    if fx == bx == 1.0 and opt == w.optimizer_s:
        return w
    layers = [l.model_copy(update={"forward_s": l.forward_s * fx, "backward_s": l.backward_s * bx}) for l in w.layers]
    return w.model_copy(update={"layers": layers, "optimizer_s": opt})


def simulate(strategy: str, w: Workload, c: ClusterSpec, o: Options, prog: Progress, steps: int = 30, seed: int = 0,
             trace_dir: Optional[Path] = None) -> Prediction:
    w = scaled(w, c)
    # the profile's device prices the workers' own work (selection, PowerSGD's products); a
    # parameter server's workers have none, and its servers are host CPUs (as BytePS's are)
    if o.cpu is None and w.kernels is not None and strategy not in PS:
        o = replace(o, cpu=w.kernels.cost_params())
    if strategy in prog.cpu_s and not o.extra_cpu_s:
        o = replace(o, extra_cpu_s=prog.cpu_s[strategy])
    if strategy in PS:
        # enough pushes for the statistics, not more: at 1,024 workers a few per worker are thousands
        pred = run_ps(strategy, w, c, o, max(4, min(steps, 4096 // c.workers + 4)), seed)
    else:
        pred = run_sync(strategy, w, c, o, steps, seed)
        n, kind, warm_o = warmup(strategy, w, c, o)
        if n:
            pred.extra["warmup_steps"] = n
            pred.extra["warmup_step_s"] = run_sync(kind, w, c, warm_o, min(steps, 12), seed).step_s
        if strategy == "ring-topk" and o.tail_from is not None:  # its exact tail: the faithful exchanges
            tail = run_sync(strategy, w, c, replace(o, in_tail=True), steps, seed)
            pred.extra["tail_from_step"] = o.tail_from
            pred.extra["tail"] = {"step_s": tail.step_s, "bytes_per_step": tail.bytes_per_step,
                                  **{k: v for k, v in tail.extra.items() if k != "buckets"}}
    pred.extra["time_to_accuracy_s"] = time_to_accuracy(pred, w, prog)
    if trace_dir is not None:
        trace_out.write(trace_dir, pred, c)
    return pred
