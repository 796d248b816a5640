"""Fit the simulator to measured runs (`ringps simulate --calibrate RUN... --out FILE`).

From each run folder (config.yaml, summary.json, metrics.jsonl) it takes the strategy, workers,
links, slowdown, the median compute and step time per step and the steps to the target, and fits:
- `compute_scale` = a: the profile's compute x a = the synchronous runs' measured compute per
  whole core (their workers share this machine's cores, which the simulator then models itself:
  sim/cpu.py), one `a` for all runs, from the loopback runs where there are any (a shaped link's
  own CPU lengthens the compute beside it: `fit_compute`);
- `ps_compute_a`: the same for a parameter-server worker, from the parameter-server runs with a
  core per worker: a synchronous step's compute also carries the collective's CPU running beside
  the backward (gloo's threads, the kernel's TCP), a push happens after it;
- `jitter`: the spread of a worker's compute from step to step (the sd of its log), which keeps
  asynchronous workers from marching in step in the model as they do not in a run;
- `forward_share`, `optimizer_share`: of a synchronous worker's compute per step, the forward's and
  the optimizer step's (after the exchange), medians over the dense runs' traces; the profile's own
  split can be off (the shipped ones time the layers alone and no optimizer: facenet's says 71%
  backward where its runs spend 51% there, 14% in the optimizer), and a slow worker's stretch,
  its backward on a core to itself and the step's end after the exchange all follow the split;
- the host kernel's CPU per byte a worker sends or receives: each step records the host kernel's
  CPU (system, irq, softirq: TCP, veth, the bridge, tbf; comm/meter.py), fitted over the dense
  runs as a per-second part plus a per-byte part (`fit_cpu_per_byte`). (Each process's own CPU,
  also recorded, barely moves with the bytes: most of the network's work is softirq, which no
  process is charged for.) It is reported, not charged (`cpu_per_byte` 0; `fit(...,
  charge_bytes=True)` charges it): that CPU runs beside the compute and the transfers the runs
  measured, so their compute and the link efficiency already carry it, and charging it again
  after the backward over-predicted the grids where it fitted above 0 (2026-12-07: 84% of 58
  cells within 15% charged, 90% not; the 1 Gbit/s and loopback settings again: 75% of 40 against
  98%; docs/RESULTS.md §6);
- `efficiency`: payload per configured link bit, the one value that makes the dense runs'
  predicted step times match on shaped links (a 1-D search, median over runs);
- `server_efficiency`: the same for the parameter-server runs, per link rate; on loopback, which
  the model stands in for with a 10 Gbit/s link, it may exceed 1 (up to LOOPBACK_MAX): a push
  there is a copy between processes, faster than the stand-in;
- `cpu_s`: per synchronous strategy, the CPU per step its exchange spends beyond what the model
  itemises (copies, fp16's casts; since 2026-12-07 PowerSGD's products and error feedback are
  itemised, `cpu_s_itemised` says so): measured less predicted step, median;
- progress (sim/progress_fit.py): each strategy's steps to the target against allreduce's in the
  same setting and seed (`factor`), allreduce's steps to the target and, from two or more worker
  counts, the gradient noise scale (`noise_batch`), and `staleness_a` of asynchronous pushes
  (one least-squares fit over the ps-* runs that reached the target, the staleness of their
  pushes up to it against allreduce's steps; where none did, the file leaves it to the shipped
  model's).
It prints how well the fit holds: predicted against measured step time, run by run.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from ringps.comm.exchanges import EXCHANGES
from ringps.config import parse_rate
from ringps.cost import EMULATED_QUEUE_S, CostParams, contention, cores
from ringps.errors import ConfigError, first_line


@dataclass
class Measured:
    run: Path
    strategy: str
    workers: int
    servers: int
    net: Optional[str]
    slowdown: Optional[list]
    compute_s: float  # median per step, the fastest worker
    step_s: float  # median wall per step
    steps_to_target: Optional[int]
    time_to_accuracy_s: Optional[float]
    seed: int
    model: str
    extra: dict
    options: Any = None  # engine Options of the run's own settings (H, density, rank...); None: defaults
    label: str = ""  # the run's name less its repeat (-r0): the strategy, or a variant of it
    kernel_cpu_s: Optional[float] = None  # the host kernel's CPU per step (None: not recorded)
    moved: float = 0.0  # bytes a worker sent and received per step, as TCP counted them
    jitter: Optional[float] = None  # the spread of the fastest worker's compute, step to step (log sd)
    batch: int = 16  # samples per worker per step
    # the fastest worker's median forward, backward and optimizer step (s), from its trace (None: no trace)
    phases: Optional[tuple[float, float, float]] = None

    @property
    def link(self) -> str:
        """The link rate it ran behind, "loopback" where unshaped (the servers' efficiency's key)."""
        return self.net or "loopback"


@dataclass(frozen=True)
class Fitted:
    """What calibration fits of the machine that ran the runs (ringps's emulated cluster)."""

    compute_a: float  # measured compute = the profile's x this, per whole core
    efficiency: float = 0.95  # payload per configured link bit
    # the servers' links' payload per bit, per link rate ("loopback": unshaped; absent: efficiency),
    # or one for every link (a hand-written calibration file)
    server_efficiency: Union[dict, float] = field(default_factory=dict)
    cpu_per_byte: float = 0.0  # CPU seconds per byte a worker moves, on the cores it computes on
    # a parameter-server worker's compute = the profile's x this, per whole core (None: compute_a)
    ps_compute_a: Optional[float] = None
    jitter: float = 0.0  # lognormal sigma of a step's compute, step to step (ClusterSpec.jitter)
    # a synchronous worker's compute per step, the forward's and optimizer step's shares (ClusterSpec's)
    forward_share: Optional[float] = None
    optimizer_share: Optional[float] = None
    # workers -> each direction of a server's lossy link while both carry transfers, x its rate:
    # measured apart (benchmarks/server_link.py, `duplex_from_probes`), not fitted; beyond the
    # largest worker count measured, that one's
    duplex: dict = field(default_factory=dict)
    # per synchronous step, the workers lining up beyond the model's (ClusterSpec.sync_wait_s):
    # measured by auto at the start (sim/auto.py `sync_wait`), not fitted from runs
    sync_wait_s: float = 0.0


def options_of(cfg: dict, summary: Optional[dict] = None, total_steps: Optional[int] = None):
    """The simulator's Options from a run's config.yaml: what the run itself was told; and from its
    summary what ring-topk's cost model decided with (the CPU constants it measured on its
    machine, the compute of its first steps), so its predicted choices are the run's;
    `total_steps`: the run's length (its metrics' start record), where its exact tail begins.
    A run from before the exact tail has none in its config: no tail."""
    from ringps.sim.engine import Options

    st, cp = cfg["strategy"], cfg.get("compress", {})
    hook = ((summary or {}).get("strategy_stats") or {}).get("rank0") or {}
    return Options(cpu=CostParams(**hook["cost_params"]) if hook.get("cost_params") else None,
                   plan_compute_s=hook.get("compute_s"), density=cp.get("density", 0.01),
                   powersgd_rank=st.get("powersgd_rank", 4),
                   local_period=st.get("local_period", 8), bucket_cap_mb=st.get("bucket_cap_mb", 25.0),
                   dense_below=cp.get("dense_below", 1 << 17),
                   value_bytes=2 if cp.get("value_dtype") in ("fp16", "bf16") else 4,
                   powersgd_start_iter=st.get("powersgd_start_iter", 10), local_warmup_steps=st.get("local_warmup_steps", 20),
                   density_warmup_epochs=cp.get("density_warmup_epochs", 2.0),
                   total_steps=total_steps, exact_tail=cp.get("exact_tail", 0.0),
                   staleness_threshold=(cfg.get("ps") or {}).get("staleness_threshold"))


def read_run(run: Path) -> Measured:
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        s = json.loads((run / "summary.json").read_text())
    except FileNotFoundError:
        raise ConfigError(f"{run}: not a finished run folder (config.yaml, summary.json)") from None
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    slow = cfg["run"].get("slowdown")
    fastest = min(range(cfg["run"]["workers"]), key=lambda w: (slow or [1] * 256)[w])
    comp = [r["compute_s"] for r in steps if r["worker"] == fastest]
    step_s = s.get("step_s_median") or 0.0
    strategy = cfg["strategy"]["strategy"]
    if strategy in ("localsgd", "diloco"):  # one step in H carries the average: the mean over whole periods
        h = cfg["strategy"]["local_period"]
        skip = cfg["strategy"]["local_warmup_steps"] if strategy == "localsgd" else 0
        ts = [r["t"] for r in sorted((r for r in steps if r["worker"] == fastest), key=lambda r: r["step"])][skip:]
        n = (len(ts) - 1) // h * h
        step_s = (ts[n] - ts[0]) / n if n else step_s
    target = cfg["train"].get("target_accuracy")
    hit = next((r for r in rows if r["kind"] == "eval" and target and r["accuracy"] >= target), None)
    reached = hit["step"] if hit else None
    # a parameter-server job's progress is its pushes (every worker's), not one worker's steps:
    # those made before the evaluation that reached the target began, each with its staleness
    pushed = [r for r in steps if r["wall"] <= hit.get("began", hit["wall"])] if hit and strategy.startswith("ps-") else []
    to_target = {"pushes": len(pushed), "dropped": sum(not r.get("applied", True) for r in pushed),
                 "histogram": dict(Counter(r["staleness"] for r in pushed if r.get("staleness") is not None))
                 } if pushed else None
    return Measured(run, strategy, cfg["run"]["workers"], cfg["run"]["servers"], cfg["run"].get("net"),
                    slow, statistics.median(comp) if comp else 0.0, step_s, reached,
                    s.get("time_to_accuracy_s"), cfg["run"]["seed"], cfg["model"]["model"],
                    {"staleness_histogram": s.get("staleness_histogram"), "pushes_applied": s.get("pushes_applied"),
                     "pushes_dropped": s.get("pushes_dropped"), "sparse_share": sparse_share(s),
                     "sparse_exchange": (main := main_exchange(s)),
                     "sparse_exchange_share": sparse_share(s, (main,)) if main else None,
                     "to_target": to_target},
                    options_of(cfg, s, next((r.get("steps") for r in rows if r["kind"] == "start"), None)),
                    label=run.name.rsplit("-r", 1)[0] if re.search(r"-r\d+$", run.name) else run.name,
                    kernel_cpu_s=s.get("host_kernel_cpu_s_per_step"),
                    moved=(s.get("bytes_sent_per_step") or 0.0) + (s.get("bytes_recv_per_step") or 0.0),
                    jitter=statistics.stdev(math.log(c) for c in comp[1:]) if len(comp) > 3 and min(comp[1:]) > 0 else None,
                    batch=cfg.get("data", {}).get("batch_size", 16),
                    # a synchronous worker's split (fit_shares); a parameter server's trace is not read for it
                    phases=None if strategy.startswith("ps-") else phases_of(run, fastest))


PHASES = ("forward", "backward", "optimizer")


def phases_of(run: Path, worker: int) -> Optional[tuple[float, float, float]]:
    """A synchronous worker's median forward, backward and optimizer step per step, from its
    trace (trace/rank-R.json, Chrome's format: `dur` in microseconds), its first step left out
    (warm-up); None where the run wrote no trace or the trace lacks one of them."""
    try:
        data = json.loads((run / "trace" / f"rank-{worker}.json").read_text())
    except (OSError, ValueError):
        return None
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    spans: dict[str, list[float]] = {k: [] for k in PHASES}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("name") in spans:
            spans[e["name"]].append(e.get("dur", 0) / 1e6)
    if any(len(v) < 2 for v in spans.values()):
        return None
    return tuple(statistics.median(spans[k][1:]) for k in PHASES)


def fit_shares(runs: list[Measured]) -> tuple[Optional[float], Optional[float]]:
    """The forward's and the optimizer step's shares of a synchronous worker's compute per step,
    median over the dense runs' traces (allreduce, fp16) without a slowdown: what the profile's own
    split may miss (the shipped profiles time the layers alone, and no optimizer). (None, None):
    no such run traced."""
    got = [m.phases for m in runs if m.phases and m.strategy in ("allreduce", "fp16") and not m.slowdown]
    if not got:
        return None, None
    shares = [(f / (f + b + o), o / (f + b + o)) for f, b, o in got]
    return tuple(round(statistics.median(x), 4) for x in zip(*shares))


def exchanges_chosen(summary: dict) -> dict[str, int]:
    """ring-topk's bucket exchanges by the exchange its cost model chose (rank 0's; {}: no record)."""
    return ((summary.get("strategy_stats") or {}).get("rank0") or {}).get("exchanges_chosen") or {}


def sparse_share(summary: dict, names: Optional[tuple[str, ...]] = None) -> Optional[float]:
    """The share of ring-topk's bucket exchanges its cost model sent sparse, or by one of `names`
    (None: no record)."""
    chosen = exchanges_chosen(summary)
    total = sum(chosen.values())
    counted = (lambda k: k in names) if names is not None else (lambda k: not EXCHANGES.get(k).whole)
    return sum(v for k, v in chosen.items() if counted(k)) / total if total else None


def main_exchange(summary: dict, least: float = 0.8) -> Optional[str]:
    """The sparse exchange that carried at least `least` of ring-topk's sparse bucket exchanges
    (None: no record, none sparse, or no one exchange that far ahead)."""
    sparse = {k: v for k, v in exchanges_chosen(summary).items() if not EXCHANGES.get(k).whole}
    if not sparse:
        return None
    name = max(sparse, key=sparse.get)
    return name if sparse[name] >= least * sum(sparse.values()) else None


def plain(runs: list[Measured]) -> dict[str, list[Measured]]:
    """Runs by strategy, a strategy's plain runs only where there are any: a variant's
    (`ring-topk+value_dtype=fp16`) own CPU and progress would blur the strategy's default."""
    out: dict[str, list[Measured]] = {}
    for m in runs:
        out.setdefault(m.strategy, []).append(m)
    return {k: [m for m in v if m.label == k] or v for k, v in out.items()}


def fit_ps_compute(runs: list[Measured], profile_s: float) -> Optional[float]:
    """`a` of a parameter-server worker: its compute against the profile's, from the runs with no
    more workers than cores (a core each; the server's updates take a fraction of one). It is
    not the synchronous runs' `a`: there the collective's CPU (gloo's threads, the kernel's TCP)
    runs beside the backward on the same cores and counts in its time; a parameter-server worker
    pushes after its backward, so its compute is the model's alone."""
    ps = [m for m in runs if m.strategy.startswith("ps-") and m.compute_s and not m.slowdown and m.workers <= cores()]
    return statistics.median(m.compute_s / profile_s for m in ps) if ps else None


def fit_compute(runs: list[Measured], profile_s: float) -> float:
    """`a` in compute_scale = a: the fastest worker's compute of the synchronous runs against the
    profile's, per the cores it had (every worker computes at once there; the simulator shares
    the cores itself, sim/cpu.py). From the loopback runs where there are any: on a shaped link
    the network's own CPU (the kernel's TCP, veth and tbf, which no process is charged for, and
    gloo's threads) runs on the same cores all through the backward, and with a worker per core
    it lengthens the compute (the 2026-12-07 grid: 2 workers computed 0.27-0.29 s a step at 100
    Mbit/s, 0.25-0.27 s at 1 Gbit/s, 0.22-0.24 s on loopback, the loopback references between
    them 0.21-0.23 s); priced as compute, it then slows every process sharing the cores, which
    over-predicted 3-4 workers by up to 34%. The link's CPU is the link efficiency's and
    `cpu_per_byte`'s to carry."""
    sync = [m for m in runs if m.compute_s and not m.strategy.startswith("ps-")] or [m for m in runs if m.compute_s]
    quiet = [m for m in sync if not m.net]
    return statistics.median(m.compute_s / (profile_s * contention(m.workers)) for m in quiet or sync)


@lru_cache(maxsize=1)  # read once: cluster_for asks for every prediction of a fit
def in_flight_ceiling() -> int:
    """The most a TCP flow keeps in flight here: the lesser of the receive and send buffers'
    ceilings (net.ipv4.tcp_rmem, tcp_wmem)."""
    try:
        return min(int(Path(f"/proc/sys/net/ipv4/tcp_{k}").read_text().split()[2]) for k in ("rmem", "wmem"))
    except (OSError, IndexError, ValueError):
        return 4 << 20  # Linux's default send-buffer ceiling


def lossy(net: Optional[str]) -> bool:
    """Whether a link of ringps's emulated cluster overflows under long transfers: its tbf queue
    (EMULATED_QUEUE_S at the link's rate: 2.5 MB at 100 Mbit/s, 25 MB at 1 Gbit/s) holds less than
    a TCP flow keeps in flight. There the flow that started first keeps the queue full and a later
    one's slow start crawls behind it (first come, first served: sim/link.py), and the drops cost
    throughput; where the queue never fills, flows share the link evenly."""
    return bool(net) and parse_rate(net) / 8 * EMULATED_QUEUE_S < in_flight_ceiling()


def cluster_for(m: Measured, f: Fitted):
    """The cluster a measured run ran on."""
    return emulated_cluster(m.workers, m.net, m.slowdown, m.servers, f, ps=m.strategy.startswith("ps-"))


def emulated_cluster(workers: int, net: Optional[str], slowdown: Optional[list], servers: int, f: Fitted,
                     ps: bool = False):
    """ringps's emulated cluster (or its loopback, net None) with the fitted constants: every
    process on this machine's cores; on a lossy link the servers' transfers take turns, at the
    servers' own efficiency; `ps`: a parameter-server worker's compute."""
    from ringps.sim.cluster import ClusterSpec

    a = f.ps_compute_a if ps and f.ps_compute_a else f.compute_a
    se = f.server_efficiency
    return ClusterSpec(workers=workers, net=net or "10gbit", slowdown=slowdown, servers=servers,
                       compute_scale=a, jitter=f.jitter, shared_cores=cores(), efficiency=f.efficiency, latency_s=2e-4,
                       fairness=0.0 if lossy(net) else 1.0,
                       server_efficiency=se.get(net or "loopback") if isinstance(se, dict) else se,
                       server_duplex=duplex_at(f.duplex, workers) if lossy(net) else 1.0, cpu_per_byte=f.cpu_per_byte,
                       # a synchronous worker's split of its compute (a parameter server's worker runs no optimizer)
                       forward_share=None if ps else f.forward_share, optimizer_share=None if ps else f.optimizer_share,
                       sync_wait_s=0.0 if ps else f.sync_wait_s)


def duplex_at(duplex: dict, workers: int) -> float:
    """The measured duplex factor of the largest worker count measured up to `workers` (1: none)."""
    below = [k for k in duplex if k <= workers]
    return duplex[max(below)] if below else 1.0


def duplex_from_probes(paths: list[Path]) -> dict[int, float]:
    """Per worker count k, what each direction of the server's link carries with k pushes in and
    k replies out at once against the pushes alone: the ratio of the medians over every repeat in
    these `benchmarks/server_link.py` results.json files ({"k/push only": [...], "k/push and
    reply": [...]}), at most 1."""
    got: dict[str, list[float]] = {}
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"--duplex {p}: not a server_link.py results.json ({first_line(e)})") from None
        for key, vals in data.items():
            got.setdefault(key, []).extend(vals)
    ks = sorted({int(k.split("/")[0]) for k in got if k.endswith("/push and reply") and f"{k.split('/')[0]}/push only" in got})
    if not ks:
        raise ConfigError(f"--duplex {' '.join(map(str, paths))}: no 'k/push only' and 'k/push and reply' results")
    return {k: round(min(1.0, statistics.median(got[f"{k}/push and reply"]) / statistics.median(got[f"{k}/push only"])), 4)
            for k in ks}


def fitted_from(prog) -> Optional[Fitted]:
    """The machine constants a calibration file (`--calibrate ... --out FILE`) carries; None for a
    file without them (the shipped progress model)."""
    if prog.compute_a is None:
        return None
    return Fitted(prog.compute_a, efficiency=prog.efficiency or 0.95, cpu_per_byte=prog.cpu_per_byte or 0.0,
                  server_efficiency=prog.server_efficiency or {}, ps_compute_a=prog.ps_compute_a, jitter=prog.jitter or 0.0,
                  duplex=dict(prog.duplex), forward_share=prog.forward_share, optimizer_share=prog.optimizer_share)


def predict_step(m: Measured, w, f: Fitted, cpu: Optional[dict] = None) -> float:
    from ringps.sim.engine import Options
    from ringps.sim.predict import Progress, simulate

    return simulate(m.strategy, w, cluster_for(m, f), m.options or Options(), Progress(cpu_s=cpu or {}), steps=12).step_s


LOOPBACK_MAX = 16.0  # the servers' loopback efficiency's ceiling: 160 Gbit/s, a memory copy's order


def fit_link(m: Measured, step_at, top: float = 1.0) -> float:
    """The efficiency in [0.05, top] at which `step_at(efficiency)`, the predicted step, matches the
    run's measured one (a bisection: the predicted step falls as efficiency rises)."""
    lo, hi = 0.05, top
    for _ in range(12 + max(0, round(math.log2(top)))):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step_at(mid) > m.step_s else (lo, mid)
    return (lo + hi) / 2


def fit_cpu_per_byte(runs: list[Measured]) -> float:
    """CPU seconds per byte a worker sends or receives. The host kernel's CPU per step is not all
    the bytes': page faults, the scheduler and timers run all the while, so it is fitted as
    b x step + c x bytes (all workers, sent and received), least squares over the dense runs
    (allreduce, fp16: the same compute, twice the bytes or half), and c is the answer (at least 0;
    0 where fewer than two runs recorded it)."""
    pts = [(m.step_s, m.workers * m.moved, m.kernel_cpu_s) for m in runs
           if m.strategy in ("allreduce", "fp16") and m.label == m.strategy and m.kernel_cpu_s is not None
           and m.moved and m.step_s]
    if len(pts) < 2:
        return 0.0
    stt = sum(t * t for t, _, _ in pts)
    sbb = sum(b * b for _, b, _ in pts)
    stb = sum(t * b for t, b, _ in pts)
    sty = sum(t * y for t, _, y in pts)
    sby = sum(b * y for _, b, y in pts)
    det = stt * sbb - stb * stb
    if det <= 1e-12 * stt * sbb:  # steps and bytes in proportion: the two cannot be told apart
        return 0.0
    return float(f"{max(0.0, (stt * sby - stb * sty) / det):.3g}")


def fit(runs: list[Measured], w, duplex: Optional[dict] = None, charge_bytes: bool = False) -> Fitted:
    """Every machine constant, in the order each depends on the ones before; `duplex`, measured
    apart (duplex_from_probes), is taken as it is and the servers' efficiency fitted with it;
    `charge_bytes`: charge the host kernel's CPU per byte moved on the workers' cores (the model
    before 2026-12-07; see the module's docstring)."""
    jit = [m.jitter for m in runs if m.jitter is not None and not m.slowdown]
    fwd, opt = fit_shares(runs)
    f = Fitted(fit_compute(runs, w.compute_s + w.optimizer_s), cpu_per_byte=fit_cpu_per_byte(runs) if charge_bytes else 0.0,
               ps_compute_a=fit_ps_compute(runs, w.compute_s), jitter=round(statistics.median(jit), 4) if jit else 0.0,
               duplex=dict(duplex or {}), forward_share=fwd, optimizer_share=opt)
    f = replace(f, efficiency=fit_efficiency(runs, w, f))
    return replace(f, server_efficiency=fit_server_efficiency(runs, w, f))


def fit_efficiency(runs: list[Measured], w, f: Fitted) -> float:
    fits = [fit_link(m, lambda e, m=m: predict_step(m, w, replace(f, efficiency=e)))
            for m in runs if m.strategy in ("allreduce", "fp16") and m.net]
    return statistics.median(fits) if fits else 0.95


def fit_server_efficiency(runs: list[Measured], w, f: Fitted) -> dict[str, float]:
    """The servers' link efficiency per link rate ("loopback" unshaped): the one value that makes
    the parameter-server runs on that link match, median over them (absent: no such run). The
    ring's efficiency, fitted on all-reduces, does not carry over: where tbf's queue overflows TCP
    loses throughput to drops a ring's steadier flows do not see (`lossy`); on a clean link the
    pushes moved more per bit than the ring (not measured apart); on loopback a push is a copy
    between processes on one host, not a wire: its 10 Gbit/s stand-in's efficiency may pass 1
    (it sat at its old ceiling of 1 already on the 2-worker runs, and the 3-4 worker loopback
    cells came out 23-79% slow)."""
    out = {}
    for net in sorted({m.link for m in runs if m.strategy.startswith("ps-")}):
        top = LOOPBACK_MAX if net == "loopback" else 1.0
        fits = [fit_link(m, lambda e, m=m: predict_step(m, w, replace(f, server_efficiency={net: e})), top)
                for m in runs if m.strategy.startswith("ps-") and m.link == net and m.step_s]
        if fits:
            out[net] = round(statistics.median(fits), 4)
    return out


def fit_cpu(runs: list[Measured], w, f: Fitted) -> dict[str, float]:
    """Per synchronous strategy, the CPU seconds per step its exchange spends beyond what the model
    itemises (PowerSGD's matrix products and error feedback; copies): the median over its runs of
    measured less predicted step time, where positive. On this machine and model only."""
    out: dict[str, list[float]] = {}
    for strategy, ms in plain(runs).items():
        for m in ms:
            if m.strategy.startswith("ps-") or m.strategy in ("localsgd", "diloco") or not m.step_s:
                continue
            out.setdefault(strategy, []).append(max(0.0, m.step_s - predict_step(m, w, f)))
    return {k: round(statistics.median(v), 4) for k, v in out.items()}


def calibrate(run_dirs: list[Path], out: Optional[str], console, duplex_probes: Optional[list[Path]] = None) -> int:
    """`duplex_probes`: benchmarks/server_link.py results of the cluster's server links, taken as
    measured (`fit`), written to the file with the rest, so `--auto-calibration` prices the
    servers' lossy links as the calibration did."""
    from ringps.sim.engine import ITEMISED_CPU
    from ringps.sim.predict import load_progress
    from ringps.sim.progress_fit import fit_dense_steps, fit_progress, fit_sparse, staleness_fit
    from ringps.sim.workload import load_workload

    runs = [read_run(r) for r in run_dirs]
    models = {m.model for m in runs}
    if len(models) != 1:
        raise ConfigError(f"--calibrate: runs of one model at a time (got {', '.join(sorted(models))})")
    w = load_workload(models.pop())
    f = fit(runs, w, duplex_from_probes(duplex_probes) if duplex_probes else None)
    cpu = fit_cpu(runs, w, f)
    factor = fit_progress(runs)
    sparse = fit_sparse(runs)
    if sparse:  # per exchange (the model weighs each bucket's own): ring-topk's one factor would override them
        factor.pop("ring-topk", None)
    stale, stale_line = staleness_fit(runs, load_progress(None).staleness_form)
    dense = fit_dense_steps(runs)
    console.print(f"compute: measured = {f.compute_a:.3f} x profile per whole core ({cores()} cores shared by each "
                  f"run's processes); the host kernel's CPU per byte moved {fit_cpu_per_byte(runs):.3g} s (reported, not "
                  f"charged: the runs' compute and links carry it); links: efficiency {f.efficiency:.3f}" +
                  (f", servers' {f.server_efficiency}" if f.server_efficiency else "") +
                  (f"; a parameter-server worker's compute {f.ps_compute_a:.3f} x profile" if f.ps_compute_a else "") +
                  (f"; the servers' lossy links each way while both are busy x {f.duplex} by workers (measured apart)"
                   if f.duplex else "") +
                  f"; compute jitter (log sd) {f.jitter:.3f}" +
                  (f"; of a synchronous worker's compute, forward {f.forward_share:.0%}, optimizer step "
                   f"{f.optimizer_share:.0%} (the dense runs' traces)" if f.forward_share is not None else "") +
                  f"; strategies' own CPU per step {cpu}")
    errors = []
    for m in runs:
        p = predict_step(m, w, f, cpu)
        err = (p - m.step_s) / m.step_s if m.step_s else math.nan
        errors.append(abs(err))
        console.print(f"  {m.run.name}: {m.strategy}, {m.workers} workers, {m.net or 'loopback'}"
                      + (f", slowdown {','.join(f'{x:g}' for x in m.slowdown)}" if m.slowdown else "") + f": step {m.step_s:.3f}s "
                      f"measured, {p:.3f}s predicted ({err:+.0%})")
    console.print(f"fit: median step-time error {statistics.median(errors):.1%} over {len(runs)} runs; progress factors {factor}; "
                  + (f"ring-topk's exchanges {sparse}; " if sparse else "")
                  + (f"steps to the target {dense['dense_steps']:g} at {dense['workers_ref']} workers"
                     + (f", gradient noise scale {dense['noise_batch']:g} samples" if "noise_batch" in dense else "") + "; "
                     if dense else "")
                  + stale_line)
    doc = {"source": f"calibrated from {len(runs)} runs ({', '.join(sorted({m.strategy for m in runs}))})",
           # steps to the target only where allreduce's runs reached it (else the profile's own)
           **dense,
           "factor": factor, **({"sparse": sparse} if sparse else {}), **stale,
           "compute_a": round(f.compute_a, 4), "efficiency": round(f.efficiency, 4),
           "server_efficiency": f.server_efficiency, "cpu_per_byte": f.cpu_per_byte,
           "ps_compute_a": round(f.ps_compute_a, 4) if f.ps_compute_a else None, "jitter": f.jitter,
           "forward_share": f.forward_share, "optimizer_share": f.optimizer_share, "cpu_s": cpu,
           "cpu_s_itemised": list(ITEMISED_CPU), "duplex": f.duplex}
    if out:
        Path(out).write_text(yaml.safe_dump(doc, sort_keys=False))
        console.print(f"written: {out}")
    return 0
