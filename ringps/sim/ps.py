"""The parameter server as discrete events (SimPy): workers, each server's link and update lock.

A worker computes (the profile's step x its slowdown x jitter; on an emulated cluster's shared
cores its forward and backward are processor-shared with every process computing at that moment,
the servers' updates included, and a slowdown is Stretch's sleep, as in engine.py), then pushes
its gradient to every server at once (shard = model / servers) and waits for the replies. A push
crosses the server's incoming link, which the pushes in flight share (evenly, or first come first
served: link.py), then takes the server's update lock for the update (a few passes over the
shard), then its reply crosses the outgoing link, shared the same way (while both directions
carry transfers, each at `server_duplex` of its rate); the bytes' CPU
(`cpu_per_byte`) follows on the worker's cores. Server 0 counts versions: a push's staleness is
the versions applied since the worker's values were sent to it (the version its last reply
carried, as the server's snapshot does); threshold drops it when over T (no version bump,
a reply all the same), SSP holds the reply while the worker is more than T pushes ahead of the
slowest, BSP waits for every worker's push of the version. Each worker's first push is recorded
apart (`first_round`: its staleness counts from the common start), with the time when as many
pushes as workers were in: predict.py counts that start once and the rest at the steady rate.

The run ends when the servers have applied workers x pushes_per_worker pushes, as an asynchronous
ringps job ends after its budget of applied updates: a fast worker pushes more often than a slow
one, and the pushes in flight then are cut off. (Ending when every worker had made as many
pushes as the others would time the slowest worker's pushes alone at the end: on 1,1,2,4 that
halved the predicted push rate.) It also ends once JUDGED_CAP x that many pushes were judged: a
threshold far below the staleness N workers bring (T = 2 at 1,024 workers) drops all but a few
in a thousand, and reaching the applied budget took millions of events (`ringps plan --auto`
at 1,024 workers ran for more than 15 minutes); the drop fraction, the histogram and the rate
are long steady by then, and a policy that drops every push ends too.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter

import simpy

from ringps.sim.cluster import ClusterSpec
from ringps.sim.engine import Options, Prediction, marker
from ringps.sim.link import SharedLink
from ringps.sim.workload import Workload

UPDATE_PASSES = 4  # weight decay, momentum, values, snapshot copy: passes over the shard per push
JUDGED_CAP = 2  # the run ends at this many times its applied budget in judged pushes, applied or not


def run_ps(strategy: str, w: Workload, c: ClusterSpec, o: Options, pushes_per_worker: int, seed: int) -> Prediction:
    policy = strategy.removeprefix("ps-")
    env, rng = simpy.Environment(), random.Random(seed)
    n, S = c.workers, c.servers
    shard = w.params / S
    # every push sends an equal shard to every server, so the S servers' links move in lockstep:
    # one link per direction stands for all of them (S times fewer events at 1,024 workers); a
    # transfer moves at most at the worker's own link rate
    up, down = (SharedLink(env, c.server_bw, cap=c.push_bw, latency=c.latency_s, fairness=c.fairness) for _ in range(2))
    if c.server_duplex < 1:  # pushes in and replies out at once: each direction slower (link.py)
        up.pair(down, c.server_duplex)
    lock = simpy.Resource(env, 1)
    t_update = UPDATE_PASSES * shard * o.kernels.pass_s  # a host CPU's: the profile's kernels are the workers'
    T = o.staleness_threshold if o.staleness_threshold is not None else (
        2 * (n - 1) if policy == "threshold" else 4)
    state = {"version": 0, "applied": 0, "dropped": 0, "dropped_first": 0, "judged": 0}
    budget, finished = n * pushes_per_worker, env.event()  # applied pushes; then the run ends
    clock = Counter()  # pushes in, per worker
    timeline: dict[int, list[tuple]] = {}
    mark = marker(timeline)
    at = Counter({0: n})  # workers per clock value: the slowest's clock without a scan
    slowest = {"clock": 0, "moved": env.event()}
    hist: Counter = Counter()
    # each worker's first push: its staleness counts from the common start (0..N-1, not the steady
    # state's ~N-1), and a run to the target has it once per worker however long it runs, where
    # this run's few pushes per worker at 1,024 workers would weigh it an eighth (predict.py)
    first: Counter = Counter()
    cycles: list[float] = []
    computes: list[float] = []
    round_done = {"version": 0, "event": env.event(), "arrived": 0}
    slow = c.slowdowns()
    fwd, bwd = w.compute_s - w.backward_s, w.backward_s
    # the emulated cluster's cores: rate = cores, a process at most one (link.py), in core-seconds
    cores = SharedLink(env, float(c.shared_cores), cap=1.0, eps=1e-9) if c.shared_cores else None
    own_cpu = c.cpu_per_byte * 2 * w.params * 4.0  # a push and its reply: every parameter each way

    def push(i: int, seen: int):
        """One push and its reply; returns the version of the values the reply carries."""
        # the shards travel in parallel, each over its server's link, shared with other workers'
        k, t_push = clock[i], env.now
        yield env.process(up.transfer(shard * 4))
        mark(i, k, "push", "comm", t_push, env.now)
        t_in = env.now  # from here the worker waits for its reply, as the client's trace has it
        with lock.request() as req:  # server 0 judges (the others apply in parallel: same time)
            yield req
            stale = state["version"] - seen
            hist[stale] += 1
            if clock[i] == 0:
                first[stale] += 1
            state["judged"] += 1
            if state["judged"] == n:  # as many pushes judged as workers: the start's transient is over
                state["round_s"] = env.now
            if policy == "threshold" and stale > T:
                state["dropped"] += 1
                state["dropped_first"] += clock[i] == 0
            elif policy == "sync":
                round_done["arrived"] += 1
                state["applied"] += 1
                if round_done["arrived"] == n:
                    yield work(t_update)
                    state["version"] += 1
                    round_done["arrived"] = 0
                    ev, round_done["event"] = round_done["event"], env.event()
                    ev.succeed()
            else:
                yield work(t_update)
                state["version"] += 1
                state["applied"] += 1
            if (state["applied"] >= budget or state["judged"] >= JUDGED_CAP * budget) and not finished.triggered:
                finished.succeed()
        if policy == "sync" and round_done["arrived"]:
            yield round_done["event"]
        tick(i)
        if policy == "ssp":  # the server holds the reply until the slowest is within T (notified, as ringps's is)
            while clock[i] - slowest["clock"] > T:
                yield slowest["moved"]
        # the reply carries the values as they are when it is sent (the server's snapshot), and
        # the worker's next push is judged against that version: the pushes applied while the
        # reply crosses the link count as staleness (versions read at the next compute's start
        # missed them, and bunched pushes looked fresher than ringps measures them)
        sent = state["version"]
        yield env.process(down.transfer(shard * 4))
        mark(i, k, "wait for reply", "comm", t_in, env.now)
        return sent

    def tick(i: int) -> None:
        """Worker i's push is in: count it, and wake SSP's held replies when the slowest moves on
        (the count of workers at each clock keeps the minimum O(1) a push at 1,024 workers; a
        poll every transfer time was ~10^6 events a round there with T = 0)."""
        at[clock[i]] -= 1
        clock[i] += 1
        at[clock[i]] += 1
        while not at[slowest["clock"]]:
            slowest["clock"] += 1
            ev, slowest["moved"] = slowest["moved"], env.event()
            ev.succeed()

    def work(secs: float) -> simpy.Event:
        """CPU work: on the emulated cluster's shared cores, processor-shared with every other
        process computing now (the workers and the servers); else on the process's own device
        (a plain timeout: no process per event at 1,024 workers)."""
        return env.process(cores.transfer(secs)) if cores is not None and secs > 0 else env.timeout(secs)

    def worker(i: int):
        last = None  # the last compute, Stretch's base
        seen = 0  # the version of the worker's values: the start's, then its last reply's
        while True:  # until the budget is applied (env.run's end)
            t0, k = env.now, clock[i]
            j = rng.lognormvariate(0, c.jitter) if c.jitter else 1.0
            if cores is None:  # a device of its own: f times slower is f times longer
                yield env.timeout(w.compute_s * slow[i] * j)  # one event: 1,024 workers push thousands of times
                mark(i, k, "forward", "compute", t0, t0 + fwd * slow[i] * j)
                mark(i, k, "backward", "compute", t0 + fwd * slow[i] * j, env.now)
            else:  # the emulated cluster's Stretch: a sleep of (f-1) x its last compute after the forward
                yield work(fwd * j)
                mark(i, k, "forward", "compute", t0, env.now)
                pause, t1 = (slow[i] - 1) * (last if last is not None else 3 * fwd * j), env.now
                yield env.timeout(pause)
                mark(i, k, "slowdown", "compute", t1, env.now)
                t2 = env.now
                yield work(bwd * j)
                mark(i, k, "backward", "compute", t2, env.now)
                last = env.now - t0 - pause
            computes.append(env.now - t0)
            seen = yield env.process(push(i, seen))
            if own_cpu:  # the bytes moved cost CPU on the cores it computes on
                t3 = env.now
                yield work(own_cpu)
                mark(i, k, "strategy CPU", "compute", t3, env.now)
            cycles.append(env.now - t0)

    for i in range(n):
        env.process(worker(i))
    env.run(until=finished)
    total = sum(hist.values())
    step_s, compute = statistics.mean(cycles), statistics.mean(computes)
    extra = {"staleness_histogram": dict(sorted(hist.items())), "drop_fraction": state["dropped"] / max(1, total),
             "server_link_occupancy": (up.busy_s + down.busy_s) / (2 * env.now) if env.now else 0.0,
             "pushes_per_s": total / env.now if env.now else 0.0, "mean_staleness": sum(k * v for k, v in hist.items()) / max(1, total),
             "first_round": {"histogram": dict(sorted(first.items())), "dropped": state["dropped_first"],
                             "until_s": state.get("round_s", 0.0), "run_s": env.now}}
    return Prediction(strategy, n, step_s, compute, step_s - compute, w.params * 4.0, compute / step_s, extra, timeline)
