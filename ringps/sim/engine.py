"""The simulator's engine: one strategy on one cluster, step by step, as discrete events (SimPy).

Synchronous strategies (allreduce, fp16, powersgd, ring-topk, topk-allgather, localsgd, diloco):
every worker computes its step (the profile's time x its slowdown x lognormal jitter, plus the
strategy's own CPU work; on an emulated cluster's shared cores, processor-shared: cpu.py); each
DDP bucket's gradients are ready when the layers in it are done in the backward pass (readiness
order); a bucket's collective starts once every worker has it and the previous one is done, and
takes its closed-form time (collectives.py); the step ends when the slowest worker's compute
and the last collective are both done, and the cluster's `sync_wait_s` later (the workers lining
up beyond what the model shows; `--strategy auto` measures it). Local SGD and DiLoCo average the
model every H steps.

Parameter servers (ps-*): workers compute and push to every server's shard; each server's link
and its update lock are SimPy resources, so pushes queue there; the judge counts versions, so
staleness, drops (threshold), the SSP bound and BSP's barrier come out of the events.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import simpy

from ringps.comm.exchanges import EXCHANGES, choose_exchange, faithful_candidates, price, progress_of, tail_start
from ringps.cost import CostParams, ring_bytes
from ringps.sim.cluster import ClusterSpec
from ringps.sim.collectives import allgather_s, allreduce_s
from ringps.sim.cpu import Phase, share
from ringps.sim.workload import Workload

SYNC = ("allreduce", "fp16", "powersgd", "ring-topk", "topk-allgather", "localsgd", "diloco")
PS = ("ps-sync", "ps-async", "ps-threshold", "ps-ssp", "ps-stale-lr", "ps-dcasgd", "ps-vsgd")
STRATEGIES = SYNC + PS


@dataclass
class Options:
    """The strategy settings a prediction depends on (the same names as `ringps train`'s)."""

    density: float = 0.01
    powersgd_rank: int = 4
    local_period: int = 8
    staleness_threshold: Optional[int] = None
    bucket_cap_mb: float = 25.0
    dense_below: int = 1 << 17
    sparse_progress: Optional[float] = None  # None: each exchange's own (Exchange.progress)
    value_bytes: int = 4
    # warm-ups, as `ringps train` runs them: their steps cost more than the steady state's
    powersgd_start_iter: int = 10  # plain all-reduce steps first
    local_warmup_steps: int = 20  # localsgd: global gradient all-reduce first
    density_warmup_epochs: float = 2.0  # ring-topk, topk-allgather: density 0.25 -> --density
    # the device's per-element costs of the strategies' own work (selection etc.); None: the
    # profile's (Workload.kernels), else this host's (CostParams's defaults); a run's recorded own
    cpu: Optional[CostParams] = None
    # CPU seconds per step of the strategy's own work that the model does not itemise (copies,
    # fp16's casts; PowerSGD's products and error feedback are itemised: ITEMISED_CPU): fitted by
    # --calibrate, 0 unless given
    extra_cpu_s: float = 0.0
    # ring-topk's cost model decides with the compute it measured: `ringps train`'s profile of the
    # model, or in a user's own loop its first steps' (the slowest rank's median); a run records
    # it, and predicting that run plans with it (None: the model's)
    plan_compute_s: Optional[float] = None
    # ring-topk's exact tail: the run's last exact_tail of its total_steps go by the most faithful
    # exchanges (None steps: the run's length unknown, no tail); in_tail prices a step inside it
    total_steps: Optional[int] = None
    exact_tail: float = 0.4
    in_tail: bool = False

    @property
    def kernels(self) -> CostParams:
        return self.cpu or CostParams()

    @property
    def tail_from(self) -> Optional[int]:
        """The first step of ring-topk's exact tail, as the hook counts it (None: no tail)."""
        return tail_start(self.total_steps, self.exact_tail)


SHOWN_WORKERS, SHOWN_STEPS = 16, 5  # the predicted timeline (trace_out.py): the first workers' first steps


def marker(timeline: dict[int, list[tuple]]):
    """`mark(i, k, name, cat, t0, t1, lane)`: worker i's step k's span, kept for the first workers'
    first steps (a timeline of 1,024 workers x every step would be most of the simulation's time)."""
    def mark(i: int, k: int, name: str, cat: str, t0: float, t1: float, lane: str = "main") -> None:
        if i < SHOWN_WORKERS and k < SHOWN_STEPS and t1 - t0 > 1e-9:  # not a rounding's worth
            timeline.setdefault(i, []).append((name, cat, t0, t1, lane))
    return mark


@dataclass
class Prediction:
    strategy: str
    workers: int
    step_s: float  # mean wall time of a step (async: of a worker's push cycle)
    compute_s: float  # mean compute per worker step
    exposed_s: float  # step less compute, per worker (communication and waiting it could not hide)
    bytes_per_step: float  # sent per worker per step
    utilization: float
    extra: dict[str, Any] = field(default_factory=dict)  # ps: staleness histogram, drops, link occupancy
    # worker -> its spans (name, category, start s, end s, lane) in the first steps, as a run's trace
    # names them (forward, backward, exposed communication, bucket i, push, ...): not in as_dict
    timeline: dict[int, list[tuple]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "workers": self.workers, "step_s": self.step_s, "compute_s": self.compute_s,
                "exposed_s": self.exposed_s, "utilization": self.utilization, "bytes_per_step": self.bytes_per_step,
                **self.extra}


# -- what each synchronous strategy sends per bucket ---------------------------------------------------
@dataclass
class Bucket:
    ready: float  # seconds into the backward pass when its gradients are all ready (profile's device)
    params: int
    sizes: list[int]

    def large(self, dense_below: int) -> int:
        """Its parameters in tensors of at least `dense_below`: those compression compresses (the
        rest go dense)."""
        return sum(p for p in self.sizes if p >= dense_below)


def buckets(w: Workload, cap_bytes: float) -> list[Bucket]:
    """DDP's buckets as ringps's DDP builds them: layers in the backward's order, a bucket closed
    once it holds the cap. ringps passes `bucket_cap_mb`, and PyTorch then makes the first bucket
    that size too (its 1 MB first bucket is for the default cap only: `_BucketCapacityConfig`);
    test_sim_buckets_are_ddps checks this against DDP's own."""
    out: list[Bucket] = []
    t, cur = 0.0, None
    for layer in reversed(w.layers):
        t += layer.backward_s
        if cur is None or cur.params * 4 >= cap_bytes:
            if cur is not None:
                out.append(cur)
            cur = Bucket(t, 0, [])
        cur.params += layer.params
        cur.sizes.append(layer.params)
        cur.ready = t
    if cur is not None:
        out.append(cur)
    return out


class Comm(NamedTuple):
    """One bucket's exchange: seconds, bytes sent per worker, parameters sent sparse and those
    selection could have sent sparse (ring-topk's sparse share, which scales its progress per
    step: predict.time_to_accuracy), and small tensors deferred to the step's one fused message."""

    secs: float  # on the link (and the collective's own latency)
    sent: float
    sparse: int = 0
    selectable: int = 0
    deferred: int = 0
    progress: float = 1.0  # of a step through the chosen exchange, relative to a dense one
    dense_as: str = ""  # a whole bucket sent dense: the DDP strategy whose update it makes (its progress)
    cpu: float = 0.0  # the exchange's own CPU (selection, packing, scatter-adds) on the worker's cores
    prep: float = 0.0  # the part of `cpu` before its first message (the selection): the wire waits for it
    exchange: str = ""  # the sparse exchange chosen (its `progress` the exchange's own; the progress model may know better)


# PowerSGD's own CPU on a bucket (torch's powerSGD_hook), priced with the device's constants
# (Options.kernels) as ring-topk's exchanges are: without it an uncalibrated prediction had PowerSGD's
# step as cheap as its bytes (its CPU, 0.06-0.09 s a step of facenet here, came only from a
# calibration's fitted cpu_s). Per bucket: the error added in, the input kept, the new error left
# (passes over the bucket); per compressed matrix M (p entries) P = M Q, Q = M^T P and P Q^T back
# into M, each a pass over M and p x rank multiply-adds. fp16's two casts are not itemised: on
# these hosts they cost what moving half the bytes saves (its step on loopback is allreduce's,
# -4..+5% over four grids), a balance a calibration's cpu_s, at least 0, could not restore.
POWERSGD_PASSES, POWERSGD_PRODUCTS = 3, 3
ITEMISED_CPU = ("powersgd",)  # calibrations before 2026-12-07 fitted this CPU into cpu_s


def powersgd_cpu_s(b: Bucket, rank: int, o: Options) -> float:
    """PowerSGD's CPU seconds on one bucket: its passes and its matrices' products."""
    k = o.kernels
    return POWERSGD_PASSES * b.params * k.pass_s + POWERSGD_PRODUCTS * b.large(o.dense_below) * (k.pass_s + rank * k.flop_s)


def bucket_comm(strategy: str, b: Bucket, c: ClusterSpec, o: Options, overlap: float,
                compute_per_param: float = 0.0) -> Comm:
    """`compute_per_param`: the step's compute per parameter; the bucket's share of it weighs a
    sparse step's lesser progress in ring-topk's choice, as the hook does."""
    n = c.workers
    if strategy in ("allreduce", "fp16"):
        nbytes = b.params * (2 if strategy == "fp16" else 4)
        return Comm(allreduce_s(nbytes, c), ring_bytes(nbytes, n, 1))
    if strategy == "powersgd":  # P and Q of rank r per matrix, two all-reduces; small tensors dense
        r = o.powersgd_rank
        floats = sum(r * 2 * math.isqrt(p) if p >= o.dense_below else p for p in b.sizes)
        nbytes = floats * 4
        return Comm(2 * allreduce_s(nbytes / 2, c), ring_bytes(nbytes, n, 1), cpu=powersgd_cpu_s(b, r, o))
    large = b.large(o.dense_below)
    small = b.params - large
    k = max(1, int(o.density * large)) if large else 0
    p = CostParams(**{**o.kernels.__dict__, "bandwidth": c.bw, "latency": c.latency_s})
    if strategy == "topk-allgather":
        t_small = allreduce_s(small * 4, c)
        if not large:
            return Comm(t_small, ring_bytes(small, n))
        cost = price("allgather", large, k, n, p)
        return Comm(allgather_s(k * 8, c) + t_small, (n - 1) * k * 8 + ring_bytes(small, n), large, large,
                    cpu=cost.cpu_s, prep=cost.prep_s)
    if not large:  # ring-topk: small tensors wait for the step's fused message
        return Comm(0.0, 0.0, deferred=small)
    name, _ = choose_exchange(large, k, n, p, overlap, candidates=faithful_candidates() if o.in_tail else None,
                              compute_s=compute_per_param * large, progress=o.sparse_progress,
                              value_bytes=o.value_bytes)
    cost = price(name, large, k, n, p, value_bytes=o.value_bytes)
    ex = EXCHANGES.get(name)
    if ex.whole:  # the whole bucket, small tensors too, in one all-reduce (the hook's dense_bucket):
        # priced as DDP's own all-reduce of it (allreduce, fp16), whose casts, copies and sums the
        # link efficiency fitted on DDP's runs carries for every strategy alike; measured, a step of ring-topk sending every
        # bucket in 16 bits is fp16 DDP's (0.467 against 0.465 s, 2 workers at 1 Gbit/s, 3 seeds)
        ddp = "allreduce" if ex.wire_bytes(o.value_bytes) == 4 else "fp16"
        return bucket_comm(ddp, b, c, o, overlap)._replace(selectable=large, dense_as=ddp)
    return Comm(cost.wire_s, cost.bytes_sent, large, large, small, progress_of(name, o.sparse_progress), cpu=cost.cpu_s,
                prep=cost.prep_s, exchange="" if o.sparse_progress is not None else name)


def worker_phases(c: ClusterSpec, fwd: float, bwd: float, extra: float, f: float, j: float,
                  last: Optional[float]) -> list[Phase]:
    """One worker's step: forward, the slowdown, backward, the strategy's CPU work (compression).
    On a real cluster a worker f times slower computes f times longer; in ringps's emulated one
    (`shared_cores`) it sleeps (f-1) x its last compute after the forward, as Stretch does, and
    the sleep frees its core for the others."""
    if c.shared_cores:
        pause = (f - 1) * (last if last is not None else 3 * fwd * j)
        return [Phase(True, fwd * j), Phase(False, pause), Phase(True, bwd * j), Phase(True, extra)]
    return [Phase(True, fwd * f * j), Phase(False, 0.0), Phase(True, bwd * f * j), Phase(True, extra * f)]


def run_sync(strategy: str, w: Workload, c: ClusterSpec, o: Options, steps: int, seed: int) -> Prediction:
    env, rng = simpy.Environment(), random.Random(seed)
    slow = c.slowdowns()
    plan = buckets(w, o.bucket_cap_mb * (1 << 20))
    bwd, fwd = w.backward_s, w.compute_s - w.backward_s
    local = strategy in ("localsgd", "diloco")
    # the compute one worker sees per step, as the hook measures it: its cores shared in an emulated cluster
    slower = max(1.0, c.workers / c.shared_cores) if c.shared_cores else 1.0
    # the step ring-topk's cost model plans with: its own profile's, where the run recorded one;
    # the backward left after a bucket (its overlap) scales with it
    seen_compute = w.compute_s * slower
    planned = o.plan_compute_s or seen_compute
    seen = planned / seen_compute if seen_compute else 1.0
    comm = ([Comm(0.0, 0.0)] * len(plan) if local
            else [bucket_comm(strategy, b, c, o, (bwd - b.ready) * slower * seen, planned / w.params)
                  for b in plan])
    fused = sum(x.deferred for x in comm)
    fused_s = allreduce_s(fused * 4, c) if fused else 0.0
    period_s = allreduce_s(w.params * 4, c) if local else 0.0
    sent_per_step = (ring_bytes(w.params, c.workers) / o.local_period if local
                     else sum(x.sent for x in comm) + ring_bytes(fused, c.workers))
    selectable = sum(x.selectable for x in comm)
    # the CPU that moving the bytes costs (system calls, the collective's copies and sums), sent and
    # received alike, on the cores the workers compute on: after the backward, beside the last
    # collectives (where the step waits on the link it hides, where it waits on the cores it adds)
    # and the exchanges' own CPU (selection, packing, scatter-adds): the communication thread's work
    # takes the cores from the backward, as the hook's cost model counts it (cpu_share 1)
    own_cpu = o.extra_cpu_s + c.cpu_per_byte * 2 * sent_per_step + sum(x.cpu for x in comm)
    # one worker's optimizer step at slowdown f and jitter j: all at once on shared cores
    f_opt = (lambda f, j: slower * j) if c.shared_cores else (lambda f, j: f * j)
    # the wall of a second of the communication thread's CPU before a sparse bucket's wire: on
    # shared cores a thread among the processes' busy ones (twice as many while their backward
    # runs beside it), as the emulated cluster's traces show; elsewhere 0, the wire from the
    # bucket's readiness (a core or a GPU stream of its own: not measured here, left as it was)
    prep_wall = (lambda during_backward: slower * (2 if during_backward else 1)) if c.shared_cores else (lambda _: 0.0)
    ends, computes = [], []
    last: list[Optional[float]] = [None] * c.workers  # each worker's last compute (the stretch's base)
    timeline: dict[int, list[tuple]] = {}
    mark = marker(timeline)

    def step(k: int):
        # each worker's phases with its slowdown and this step's jitter, sharing the cores in an
        # emulated cluster; bucket b is ready when the slowest worker's backward has done ready_b
        t0 = env.now
        js = [rng.lognormvariate(0, c.jitter) if c.jitter else 1.0 for _ in slow]
        ph = [worker_phases(c, fwd, bwd, own_cpu, f, j, last[i]) for i, (f, j) in enumerate(zip(slow, js))]
        share(ph, c.shared_cores, t0)
        for i, p in enumerate(ph):
            last[i] = (p[0].end - p[0].start) + (p[2].end - p[2].start)
        computes.append(statistics.mean(p[2].end - t0 + w.optimizer_s * f_opt(f, j) for p, f, j in zip(ph, slow, js)))
        busy, spans = t0, []
        bwd_end = max(p[2].end for p in ph)
        for n, (b, x) in enumerate(zip(plan, comm)):  # every worker's bucket b, then its collective
            ready = max(p[2].time_at(b.ready / bwd * p[2].amount if bwd else 0.0) for p in ph)
            # a sparse bucket's selection runs on the communication thread before its first message:
            # the wire starts after the selection's wall (its CPU is charged to the cores after the
            # backward as well: there it takes core time, here it holds the wire back)
            selected = ready + x.prep * prep_wall(ready < bwd_end)
            if selected > ready:  # on the trace's comm lane, as a run's "<exchange>: prepare"
                spans.append((f"bucket {n}: selection", ready, selected))
            start = max(busy, selected)
            spans.append((f"bucket {n}", start, start + x.secs))
            busy = start + x.secs
        if fused:  # ring-topk's deferred small tensors, once the last bucket is in
            start = max(busy, bwd_end)
            spans.append(("small tensors (fused)", start, start + fused_s))
            busy = start + fused_s
        end = max(busy, max(p[3].end for p in ph))
        # the workers lining up at the step's last collective beyond what fair sharing of the cores
        # shows (ClusterSpec.sync_wait_s: auto measures it); local SGD lines up once a period
        wait = c.sync_wait_s / (o.local_period if local else 1)
        if wait:
            spans.append(("waiting for the slowest worker", end, end + wait))
            end += wait
        # the optimizer's step, once the exchange is in: every worker's at once (on shared cores,
        # shared; a real cluster's slow worker's f times longer, Stretch sleeps before it)
        opt_s = (w.optimizer_s * max(f_opt(f, j) for f, j in zip(slow, js))) if w.optimizer_s else 0.0
        opt_start, end = end, end + opt_s
        if local:  # the model average every H steps, spread over them (the mean step over a period)
            spans.append(("model averaging", end, end + period_s / o.local_period))
            end += period_s / o.local_period
        for i, p in enumerate(ph[:SHOWN_WORKERS] if k < SHOWN_STEPS else []):  # the step as a run's trace shows it
            for name, ph_i in (("forward", 0), ("slowdown", 1), ("backward", 2), ("strategy CPU", 3)):
                mark(i, k, name, "compute", p[ph_i].start, p[ph_i].end)
            mark(i, k, "exposed communication", "comm", p[3].end, opt_start)
            mark(i, k, "optimizer", "compute", opt_start, opt_start + opt_s)
            for name, a, z in spans:
                mark(i, k, name, "comm", a, z, lane="comm")
        yield env.timeout(end - t0)
        ends.append(env.now - t0)

    def run():
        for k in range(steps):
            yield env.process(step(k))

    env.process(run())
    env.run()
    step_s, compute = statistics.mean(ends), statistics.mean(computes)
    extra = {"buckets": len(plan)}
    if selectable:
        sparse = sum(x.sparse for x in comm)
        extra["sparse_share"] = sparse / selectable
        if sparse:
            extra["sparse_progress"] = sum(x.sparse * x.progress for x in comm) / sparse
            # per exchange, what it sent and its own progress (the hook's constant, which chose it):
            # predict.sync_factor prices each at the progress model's measured one where it has one
            by: dict[str, dict] = {}
            for x in comm:
                if x.sparse and x.exchange:
                    by.setdefault(x.exchange, {"params": 0, "progress": x.progress})["params"] += x.sparse
            if by:
                extra["sparse_exchanges"] = by
        dense = {}  # the selectable parameters sent dense, by the DDP strategy whose update that is
        for x in comm:
            if x.dense_as:
                dense[x.dense_as] = dense.get(x.dense_as, 0) + x.selectable
        if dense:
            extra["dense_as"] = dense
    return Prediction(strategy, c.workers, step_s, compute, step_s - compute, sent_per_step, compute / step_s, extra,
                      timeline)
