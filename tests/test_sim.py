"""The simulator: closed-form collectives against hand-computed values, discrete events that show
what the cluster does (a slow worker holds a synchronous step, makes an asynchronous one stale,
threshold drops), workload and cluster files validated in one line, the CLI's JSON."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
from conftest import run_ranks
from helpers import toy

from ringps.errors import ConfigError
from ringps.sim.cluster import ClusterSpec, load_cluster
from ringps.sim.collectives import allreduce_s, ring_allreduce_s
from ringps.sim.engine import Options, buckets
from ringps.sim.predict import Progress, simulate
from ringps.sim.workload import load_workload


def test_ring_allreduce_is_alpha_beta():
    assert ring_allreduce_s(8e6, 4, 1e8, 1e-3) == pytest.approx(6 * 1e-3 + 1.5 * 8e6 / 1e8)
    assert ring_allreduce_s(8e6, 1, 1e8, 1e-3) == 0.0
    c = ClusterSpec(workers=8, net="8gbit", latency_s=0.0, node_size=4, intra_net="80gbit", efficiency=1.0)
    # reduce-scatter + all-gather inside the node (3/4 of the bytes each), then 4 rings of 1/4 over
    # 2 nodes side by side, all through the node's one 1 GB/s link: the whole gigabyte's ring time
    assert allreduce_s(1e9, c) == pytest.approx(2 * 0.75 * 1e9 / 1e10 + 2 * 0.5 * 1e9 / 1e9)


def test_workload_times_from_flops_and_buckets_in_backward_order():
    w = toy()
    assert [l.forward_s + l.backward_s for l in w.layers] == pytest.approx([0.25, 0.75])
    b = buckets(w, 1 << 20)
    assert b[0].sizes == [500_000] and b[0].ready == pytest.approx(0.5)  # the last layer's grads come first
    whole = buckets(w, 25 * (1 << 20))  # 4 MB in all: one bucket, ready when the backward is done
    assert [x.sizes for x in whole] == [[500_000, 500_000]] and whole[0].ready == pytest.approx(w.backward_s)


def ddp_bucket_sizes(rank: int, world: int, caps: tuple[float, ...]) -> dict[float, list[int]]:
    """The elements of each bucket DDP hands its comm hook, as ringps's DDP is built (an explicit
    bucket_cap_mb), on the third step: after the rebuild in the backward's real order."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ringps.models import build_model

    out = {}
    for cap in caps:
        torch.manual_seed(0)
        seen: list[int] = []

        def hook(state, bucket, seen=seen):
            seen.append(bucket.buffer().numel())
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp = DDP(build_model("facenet", (1, 112, 92), 40), bucket_cap_mb=cap, gradient_as_bucket_view=True)
        ddp.register_comm_hook(None, hook)
        for _ in range(3):
            seen.clear()
            F.cross_entropy(ddp(torch.randn(4, 1, 112, 92)), torch.randint(0, 40, (4,))).backward()
        out[cap] = list(seen)
    return out


@pytest.mark.slow
def test_sim_buckets_are_ddps():
    """The simulator's buckets are DDP's own for the shipped facenet profile, at the default cap
    and at the layer strategy's 1 MB: no 1 MB first bucket when the cap is given (it put the
    classifier's last two layers in a bucket of their own, which ring-topk then priced apart)."""
    w = load_workload("facenet")
    real = run_ranks(ddp_bucket_sizes, 2, ((25.0, 1.0),))[0]
    for cap, sizes in real.items():
        assert [b.params for b in buckets(w, cap * (1 << 20))] == sizes, cap
    assert len(real[25.0]) == 2  # the classifier's three layers, then the convolutions


def test_a_slow_worker_holds_a_synchronous_step_and_makes_async_pushes_stale():
    w, o = toy(), Options()
    even = simulate("allreduce", w, ClusterSpec(workers=4, net="100gbit"), o, Progress(), steps=10)
    slow = simulate("allreduce", w, ClusterSpec(workers=4, net="100gbit", slowdown=[1, 1, 1, 4]), o, Progress(), steps=10)
    assert even.step_s == pytest.approx(1.0, rel=0.05) and slow.step_s == pytest.approx(4.0, rel=0.05)
    a = simulate("ps-async", w, ClusterSpec(workers=4, net="100gbit", slowdown=[1, 1, 1, 4]), o, Progress(), steps=20)
    t = simulate("ps-threshold", w, ClusterSpec(workers=4, net="100gbit", slowdown=[1, 1, 1, 4]),
                 Options(staleness_threshold=2), Progress(), steps=20)
    assert max(a.extra["staleness_histogram"]) >= 9  # the slow worker's pushes: ~3 pushes of 3 others
    # the slow worker makes ~1/13 of the pushes (4x slower than 3 others), all over T = 2: dropped
    assert 0.05 < t.extra["drop_fraction"] < 0.1 and a.extra["drop_fraction"] == 0.0
    assert a.step_s < slow.step_s  # nobody waits for the slow one


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threshold", [0, 2])
def test_a_threshold_that_drops_nearly_every_push_ends_the_run(threshold):
    """At 256 workers the steady staleness is ~255, so T = 2 keeps a few pushes in a hundred and
    T = 0 fewer: the run ends at twice its applied budget in judged pushes (`ringps plan --auto`
    ranks T = 2 at every worker count, and at 1,024 workers it ran for more than 15 minutes
    waiting for the applied budget). What is kept is priced by the drop fraction, so the time to
    the target is the fresh pushes' over the share kept."""
    from ringps.sim.ps import JUDGED_CAP

    c, w = ClusterSpec(workers=256, net="100gbit"), toy()
    t = simulate("ps-threshold", w, c, Options(staleness_threshold=threshold), Progress(staleness_a=0.1), steps=4)
    judged = sum(t.extra["staleness_histogram"].values())
    budget = 256 * 4  # applied pushes: workers x steps
    assert judged <= JUDGED_CAP * budget + 256  # the pushes in flight at the end are judged too
    assert t.extra["drop_fraction"] > 0.9 and max(t.extra["staleness_histogram"]) > threshold
    assert t.extra["mean_staleness"] < 4  # what the judge sees: pushes from workers a drop left fresh
    a = simulate("ps-async", w, c, Options(), Progress(staleness_a=0.1), steps=4)
    assert t.extra["time_to_accuracy_s"] > 3 * a.extra["time_to_accuracy_s"]  # dropping costs more than staleness

@pytest.mark.timeout(60)
def test_ssp_holds_a_worker_ahead_until_the_slowest_moves():
    """SSP's bound: with T = 0 a worker 3x faster than the other is held at the server until the
    slow one's push is in, so both push once every 3 s (2/3 a second; asynchronous: 1 + 1/3);
    with T = 1 the fast one runs one push ahead and no more, so the rate stays the slow one's in
    the long run. The held replies wake when the slowest moves, as ringps's server notifies them
    (a poll every transfer time took more than 2 minutes at 1,024 workers with T = 0). 256 workers
    at T = 0 go in lockstep rounds: each computes 1 s, then the server applies the round's 256
    pushes one at a time (4 passes over 10^6 parameters at 1 ns: 4 ms each), which asynchronous
    pushes would hide behind the others' compute."""
    from ringps.sim.ps import UPDATE_PASSES

    fast = {"net": "1000gbit", "latency_s": 0.0, "efficiency": 1.0, "slowdown": [1, 3]}
    rate = {T: simulate("ps-ssp", toy(), ClusterSpec(workers=2, **fast), Options(staleness_threshold=T), Progress(),
                        steps=30).extra["pushes_per_s"] for T in (0, 1, 100)}
    assert rate[0] == pytest.approx(2 / 3, rel=0.02) and rate[1] == pytest.approx(2 / 3, rel=0.1)
    assert rate[100] == pytest.approx(4 / 3, rel=0.05)  # never held: asynchronous
    many = simulate("ps-ssp", toy(), ClusterSpec(workers=256, net="1000gbit", latency_s=0.0, efficiency=1.0),
                    Options(staleness_threshold=0), Progress(), steps=4)
    update_s = UPDATE_PASSES * 1e6 * Options().kernels.pass_s
    assert many.step_s == pytest.approx(1.0 + 256 * update_s, rel=0.02)
    assert many.extra["mean_staleness"] == pytest.approx(255 / 2, rel=0.02)  # each push of a round bumps the version


def test_predicted_seconds_keep_three_figures():
    """`ringps plan --auto` printed whole seconds: fp16's 4.66 s and allreduce's 5.03 s both read
    5 s; an exponent (4.79e+04) is no better for a table."""
    from ringps.sim.auto import seconds

    assert [seconds(x) for x in (0.04662, 4.662, 5.03, 264.2, 2819.4, 47939.0)] == [
        "0.0466 s", "4.66 s", "5.03 s", "264 s", "2,820 s", "47,900 s"]


def test_a_sparse_buckets_wire_waits_for_its_selection():
    """The exchanges select on the communication thread before their first message
    (Exchange.reduce: prepare, then combine), so a sparse bucket's wire starts after the
    selection's wall, not at the bucket's readiness: facenet's 10.1M-parameter classifier bucket
    is ready early in the backward, where at 100 Mbit/s the selection (102 ms in a 4-worker run's
    trace here, its CPU ~25 ms) used up the backward the model counted for the wire. On shared
    cores the selection's second takes 2 x the processes per core while the backward runs beside
    it (4 workers, 2 cores: 4 s). Where each worker has its own cores (not measured here) the
    wire starts at readiness as before; a bucket sent whole waits for nothing."""
    from ringps.cost import CostParams

    w = load_workload("facenet")
    large = buckets(w, 25 << 20)[0].large(Options().dense_below)
    assert large > 10_000_000

    def bucket_start(select_s: float, **cluster) -> float:
        o = Options(cpu=CostParams(select_s=select_s))
        p = simulate("topk-allgather", w, ClusterSpec(workers=4, net="100mbit", **cluster), o, Progress(), steps=2)
        return next(a for n, _, a, _, lane in p.timeline[0] if n == "bucket 0" and lane == "comm")

    shared, own = {"compute_scale": 2.0, "shared_cores": 2}, {}
    o = Options(cpu=CostParams(select_s=4e-9))
    p = simulate("topk-allgather", w, ClusterSpec(workers=4, net="100mbit", **shared), o, Progress(), steps=2)
    comm = {n: (a, z) for n, _, a, z, lane in p.timeline[0] if lane == "comm" and n.startswith("bucket 0")}
    # the trace shows the selection on the comm lane, the wire right after it
    assert comm["bucket 0: selection"][1] == pytest.approx(comm["bucket 0"][0])
    assert comm["bucket 0: selection"][1] - comm["bucket 0: selection"][0] == pytest.approx(large * 4e-9 * 4)
    for cluster, wall in ((shared, 2 * 4 / 2), (own, 0.0)):
        shift = bucket_start(4e-9, **cluster) - bucket_start(1e-9, **cluster)
        assert shift == pytest.approx(large * 3e-9 * wall, rel=1e-6, abs=1e-12)
    # a bucket sent whole (allreduce) starts at its readiness, whatever the selection would cost
    ar = [simulate("allreduce", w, ClusterSpec(workers=4, net="100mbit", **shared), Options(cpu=CostParams(select_s=s)),
                   Progress(), steps=2) for s in (1e-9, 4e-9)]
    assert ar[0].timeline[0] == ar[1].timeline[0]


def test_the_predicted_timeline_is_the_simulated_steps(tmp_path):
    """`--trace` writes what the simulation did, worker by worker, named as a run's trace names it
    (it drew every worker's steps at the mean step: a parameter server's fast worker pushed as
    seldom as its slow one, and no synchronous worker ever waited). 1 s of compute (a third
    forward), workers 1 and 2x, transfers instant: the fast one waits from 1 s to 2 s for the
    slow one's backward; asynchronous, it pushes twice as often."""
    import json

    fast = {"net": "1000gbit", "latency_s": 0.0, "efficiency": 1.0, "slowdown": [1, 2]}
    p = simulate("allreduce", toy(), ClusterSpec(workers=2, **fast), Options(), Progress(), steps=3,
                 trace_dir=tmp_path / "ar")
    spans = {i: [(n, round(a, 3), round(b, 3)) for n, _, a, b, _ in sp] for i, sp in p.timeline.items()}
    assert spans[0][:3] == [("forward", 0, 0.333), ("backward", 0.333, 1.0), ("exposed communication", 1.0, 2.0)]
    assert ("backward", 0.667, 2.0) in spans[1] and ("exposed communication", 2.0, 2.0) in spans[1]  # the collective's 32 us
    assert [n for n, *_ in spans[0]].count("forward") == 3  # every step simulated, up to SHOWN_STEPS
    a = simulate("ps-async", toy(), ClusterSpec(workers=2, **fast), Options(), Progress(), steps=3)
    pushes = {i: [t0 for n, _, t0, _, _ in sp if n == "push"] for i, sp in a.timeline.items()}
    assert len([t for t in pushes[0] if t < 4.5]) == 4 and len([t for t in pushes[1] if t < 4.5]) == 2
    trace = json.loads((tmp_path / "ar" / "trace" / "sim-rank-0.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {e["name"] for e in events if e.get("ph") == "X"}
    assert {"forward", "backward", "exposed communication"} <= names
    # at scale the timeline is the first workers' first steps, not 1,024 workers' every step
    big = simulate("ps-async", toy(), ClusterSpec(workers=256, net="100gbit"), Options(), Progress(), steps=4)
    assert len(big.timeline) == 16 and max(sum(n == "push" for n, *_ in sp) for sp in big.timeline.values()) <= 5


def test_async_push_rate_is_every_workers_own_rate_summed():
    """An asynchronous job ends after a budget of applied pushes, not after the same number of
    pushes from each worker: on 1,1,2,4 with 1 s of compute and instant transfers the servers
    take 1 + 1 + 1/2 + 1/4 = 2.75 pushes a second, and the slow worker makes 1/11 of them. (Each
    worker pushing 20 times ran the slow one alone at the end: 80 pushes in 80 s, 1 a second.)"""
    fast = {"net": "1000gbit", "latency_s": 0.0, "efficiency": 1.0, "slowdown": [1, 1, 2, 4]}
    p = simulate("ps-async", toy(), ClusterSpec(workers=4, **fast), Options(), Progress(), steps=20)
    assert p.extra["pushes_per_s"] == pytest.approx(2.75, rel=0.05)
    # most pushes are the fast workers': the mean time between a worker's pushes is 4 / 2.75 s
    assert p.step_s == pytest.approx(4 / 2.75, rel=0.05)
    # a push is as stale as the others' pushes while it computed: 1.75 for a fast worker's, 4.5 for
    # the 2x one's, 10 for the 4x one's; weighted by their shares of the pushes, 8.25 / 2.75 = 3
    assert max(p.extra["staleness_histogram"]) == 10
    assert p.extra["mean_staleness"] == pytest.approx(3.0, rel=0.1)


def test_staleness_counts_the_pushes_applied_while_the_reply_crossed_the_link():
    """A reply carries the server's values as they are when it is sent (its snapshot's version),
    and the next push is judged against that version, as ringps's server does. Hand-computed: 2
    equal workers, 1 s of compute, a transfer alone 1 s (4 MB at 32 Mbit/s), a fair link: both
    push at 1 s and finish at 3 s; worker 0's push is applied (version 1), then worker 1's (2);
    the replies carry versions 1 and 2, and at the next applies (2, then 3) each push is 1 behind,
    and so on: N - 1 = 1 for every push but the very first. (Reading the version when the next
    compute starts, after the reply, counted worker 0's pushes 0 behind: mean 0.5.)"""
    link = {"net": "32mbit", "latency_s": 0.0, "efficiency": 1.0}
    p = simulate("ps-async", toy(), ClusterSpec(workers=2, **link), Options(), Progress(), steps=20)
    assert p.extra["staleness_histogram"][0] == 1 and set(p.extra["staleness_histogram"]) == {0, 1}
    assert p.step_s == pytest.approx(5.0, rel=0.01)  # 1 s of compute, 2 s each for the shared pushes and replies
    # 4 workers bunched the same way: every push after the first round is 3 behind
    p = simulate("ps-async", toy(), ClusterSpec(workers=4, **link), Options(), Progress(), steps=20)
    hist = p.extra["staleness_histogram"]
    assert sorted(hist) == [0, 1, 2, 3] and hist[3] == sum(hist.values()) - 3


def test_processor_sharing_against_hand_computed_phases():
    from ringps.sim.cpu import Phase, share

    # 3 workers of 1 s of CPU on 2 cores: each at 2/3 of a core, all done at 1.5 s
    ph = [[Phase(True, 1.0)] for _ in range(3)]
    share(ph, 2)
    assert [p[0].end for p in ph] == pytest.approx([1.5] * 3)
    # one of them sleeps 1 s first: the other two run alone (rate 1) and end at 1 s, then the
    # sleeper computes alone and ends at 2 s; half of its work is done at 1.5 s
    ph = [[Phase(True, 1.0)], [Phase(True, 1.0)], [Phase(False, 1.0), Phase(True, 1.0)]]
    share(ph, 2)
    assert [p[-1].end for p in ph] == pytest.approx([1.0, 1.0, 2.0]) and ph[2][1].time_at(0.5) == pytest.approx(1.5)
    # 4 workers of 1 s on 2 cores, then one sleeps 3 s before 1 s of backward: the first phase at
    # rate 1/2 (2 s), the other three's backward at 2/3 (3.5 s), the sleeper's alone (6 s); without
    # sharing 5 s
    ph = [[Phase(True, 1.0), Phase(False, 3.0 if i == 3 else 0.0), Phase(True, 1.0)] for i in range(4)]
    share(ph, 2)
    assert ph[3][2].end == pytest.approx(6.0) and ph[0][2].end == pytest.approx(3.5)
    share(ph2 := [[Phase(True, 1.0), Phase(False, 3.0), Phase(True, 1.0)]], None)
    assert ph2[0][2].end == pytest.approx(5.0)


def test_an_emulated_slow_worker_sleeps_and_frees_the_shared_cores():
    """ringps's --slowdown sleeps (f-1) x the last compute on a machine whose cores the workers share:
    the slow worker computes alone while the others wait, so its step is well under f x the
    all-busy compute, which is what a static contention factor predicts."""
    w, o = toy(), Options()
    static = simulate("allreduce", w, ClusterSpec(workers=4, net="100gbit", slowdown=[1, 1, 1, 4], compute_scale=2.0), o,
                      Progress(), steps=10)
    shared = simulate("allreduce", w, ClusterSpec(workers=4, net="100gbit", slowdown=[1, 1, 1, 4], shared_cores=2), o,
                      Progress(), steps=10)
    even = simulate("allreduce", w, ClusterSpec(workers=4, net="100gbit", shared_cores=2), o, Progress(), steps=10)
    assert static.step_s == pytest.approx(8.0, rel=0.05) and even.step_s == pytest.approx(2.0, rel=0.05)
    # forward 0.25 s at half a core (0.5 s), backward 0.75 s alone; the stretch, 3 x (0.5 + 0.75)
    assert shared.step_s == pytest.approx(0.5 + 3 * 1.25 + 0.75, rel=0.05)


def test_the_optimizer_steps_after_the_exchange_and_a_calibrations_shares_split_the_compute():
    """DDP steps the optimizer once the exchange is in, so its time adds to the step where the link
    hides none of it: a slow worker's f times its own on a real cluster, every worker's at once on
    shared cores. A calibration's shares re-split the profile's compute into forward, backward and
    optimizer step, each layer keeping its proportion within the forward and within the backward."""
    from ringps.sim.predict import scaled

    w, fast = toy().model_copy(update={"optimizer_s": 0.5}), dict(net="100gbit")

    def step(wl, **c):
        return simulate("allreduce", wl, ClusterSpec(**fast, **c), Options(), Progress(), steps=6).step_s

    assert step(toy(), workers=2) == pytest.approx(1.0, rel=0.02)
    assert step(w, workers=2) == pytest.approx(1.5, rel=0.02)
    assert step(w, workers=2, slowdown=[1, 2]) == pytest.approx(2.0 + 1.0, rel=0.02)
    # 4 workers on 2 cores: 1 s of compute at half a core, then the four optimizer steps at half
    assert step(w, workers=4, shared_cores=2) == pytest.approx(2.0 + 1.0, rel=0.02)
    # the toy's 1 s (a third forward), x2, split 50% forward, 20% optimizer, the rest backward
    c = ClusterSpec(workers=2, forward_share=0.5, optimizer_share=0.2, compute_scale=2.0, **fast)
    s = scaled(toy(), c)
    assert (s.compute_s - s.backward_s, s.backward_s, s.optimizer_s) == pytest.approx((1.0, 0.6, 0.4))
    assert s.layers[1].backward_s / s.layers[0].backward_s == pytest.approx(3.0)  # the FLOPs' 1:3
    assert s.layers[1].forward_s / s.layers[0].forward_s == pytest.approx(3.0)
    assert step(toy(), workers=2, forward_share=0.5, optimizer_share=0.2, compute_scale=2.0) == pytest.approx(2.0, rel=0.02)
    with pytest.raises(ConfigError, match=r"^cluster: forward_share 0.7 \+ optimizer_share 0.3 .*sum < 1"):
        load_cluster(None, {"forward_share": 0.7, "optimizer_share": 0.3})


def test_cpu_per_byte_moved_competes_with_compute_on_shared_cores():
    """4 workers on 2 cores, a link fast enough not to matter: each all-reduce step (1 s of compute
    at a whole core each: 2 s) moves 2 x 1.5 x 4 MB per worker; at 25 ns a byte that is 0.3 s of CPU
    per worker, the four of them at half a core: +0.6 s. With a device (and cores) per worker: +0.3 s."""
    w, o = toy(), Options()
    moved = 2 * 1.5 * 4e6
    shared = [simulate("allreduce", w, ClusterSpec(workers=4, net="100gbit", shared_cores=2, cpu_per_byte=c), o,
                       Progress(), steps=6).step_s for c in (0.0, 0.3 / moved)]
    assert shared[0] == pytest.approx(2.0, rel=0.02) and shared[1] == pytest.approx(2.6, rel=0.02)
    own = simulate("allreduce", w, ClusterSpec(workers=4, net="100gbit", cpu_per_byte=0.3 / moved), o, Progress(), steps=6)
    assert own.step_s == pytest.approx(1.3, rel=0.02)
    # on a slow link the same CPU hides under the transfer
    slow = [simulate("allreduce", w, ClusterSpec(workers=4, net="10mbit", shared_cores=2, cpu_per_byte=c), o,
                     Progress(), steps=6).step_s for c in (0.0, 0.3 / moved)]
    assert slow[1] == pytest.approx(slow[0], rel=0.01)


def test_the_workers_wait_to_line_up_is_charged_to_every_synchronous_step_and_not_to_the_servers():
    """sync_wait_s (what auto measured its DDP step to take beyond the model's): every synchronous
    strategy's step is that much longer, whatever it sends and on a link slow or fast; local SGD's
    once a period, at its average; an asynchronous or a server's worker never waits on the others.
    It shows on the predicted timeline."""
    w, o = load_workload("facenet"), Options()
    for net in ("10gbit", "100mbit"):
        c = ClusterSpec(workers=4, net=net, shared_cores=2)
        waited = c.model_copy(update={"sync_wait_s": 0.05})
        for s in ("allreduce", "fp16", "powersgd", "ring-topk", "topk-allgather"):
            base, more = (simulate(s, w, x, o, Progress(), steps=6) for x in (c, waited))
            assert more.step_s == pytest.approx(base.step_s + 0.05, abs=1e-9), (net, s)
            assert more.compute_s == pytest.approx(base.compute_s) and more.exposed_s == pytest.approx(base.exposed_s + 0.05)
        local = [simulate("localsgd", w, x, Options(local_period=8), Progress(), steps=16).step_s for x in (c, waited)]
        assert local[1] == pytest.approx(local[0] + 0.05 / 8, abs=1e-9)
        for s in ("ps-async", "ps-threshold"):
            assert simulate(s, w, waited, o, Progress(), steps=6).step_s == simulate(s, w, c, o, Progress(), steps=6).step_s
    spans = [e for e in simulate("allreduce", w, waited, o, Progress(), steps=3).timeline[0]
             if "waiting for the slowest worker" in e]
    assert len(spans) == 3
    with pytest.raises(ConfigError, match="--sync-wait-s"):
        load_cluster(None, {"sync_wait_s": -1.0})


def test_cpu_per_byte_is_the_host_kernels_cpu_per_byte_beside_its_cpu_per_second():
    """The runs' recorded host kernel CPU per step = b x step + c x bytes (all workers, sent and
    received): least squares over the dense runs gives c; parameter-server runs and variants do not
    count; a per-second part alone (c = 0) is not mistaken for bytes."""
    from pathlib import Path

    from ringps.sim.calibrate import Measured, fit, fit_cpu_per_byte

    w = load_workload("facenet")

    def m(strategy, workers, step, moved, b=0.3, c=1e-9, label=None):
        return Measured(Path(f"/r/{strategy}"), strategy, workers, 1, "1gbit", None, 0.5, step, None, None, 0, "facenet",
                        {}, label=label or strategy, kernel_cpu_s=b * step + c * workers * moved, moved=moved)

    runs = [m("allreduce", 2, 0.6, 8.6e7), m("fp16", 2, 0.48, 4.3e7), m("allreduce", 4, 1.0, 1.3e8),
            m("ps-async", 2, 1.0, 8.6e7, c=9e-9), m("fp16", 2, 0.4, 4.3e7, c=9e-9, label="fp16+x=1")]
    assert fit_cpu_per_byte(runs) == pytest.approx(1e-9, rel=1e-3)
    assert fit(runs, w, charge_bytes=True).cpu_per_byte == pytest.approx(1e-9, rel=1e-3)
    assert fit(runs, w).cpu_per_byte == 0.0  # reported, not charged by default (calibrate.py)
    baseline = [m("allreduce", 2, 0.6, 8.6e7, c=0.0), m("fp16", 2, 0.48, 4.3e7, c=0.0)]
    assert fit_cpu_per_byte(baseline) == pytest.approx(0.0, abs=1e-15)
    assert fit_cpu_per_byte(baseline[:1]) == 0.0  # one run: b and c cannot both be known
    assert fit_cpu_per_byte([m("allreduce", 2, 0.6, 8.6e7), m("fp16", 2, 0.6, 8.6e7)]) == 0.0  # in proportion


def test_calibration_fits_a_strategys_own_cpu_from_what_the_model_misses():
    from pathlib import Path

    from ringps.sim.calibrate import Fitted, Measured, fit_cpu, predict_step

    w = load_workload("facenet")
    m = Measured(Path("/r/p"), "powersgd", 2, 1, "10gbit", None, 0.2, 0.0, None, None, 0, "facenet", {})
    f = Fitted(2.0, 0.9)
    m.step_s = predict_step(m, w, f) + 0.06  # 60 ms of PowerSGD's products the model does not itemise
    cpu = fit_cpu([m], w, f)
    assert cpu["powersgd"] == pytest.approx(0.06, abs=2e-3)
    assert predict_step(m, w, f, cpu) == pytest.approx(m.step_s, rel=0.02)


def test_compression_shortens_a_communication_bound_step():
    w, c, o = load_workload("facenet"), ClusterSpec(workers=4, net="100mbit"), Options()
    ar = simulate("allreduce", w, c, o, Progress(), steps=5)
    fp16 = simulate("fp16", w, c, o, Progress(), steps=5)
    rt = simulate("ring-topk", w, c, o, Progress(), steps=5)
    assert fp16.bytes_per_step == pytest.approx(ar.bytes_per_step / 2, rel=0.01)
    assert rt.step_s < 0.2 * ar.step_s and ar.extra["time_to_accuracy_s"] > rt.extra["time_to_accuracy_s"]


def test_a_measured_profile_carries_the_whole_forward_and_backward():
    """`ringps profile` times the modules that own parameters; facenet's ReLUs, pooling, dropout
    and loss run between them (58% of its forward here). The workload must carry them: its compute
    is the whole forward and backward, each layer keeping its share of its own time."""
    import torch

    from ringps.models import build_model
    from ringps.schedule.profile import profile_model
    from ringps.sim.workload import from_profile

    torch.manual_seed(0)
    model = build_model("facenet", (1, 112, 92), 40)
    prof = profile_model(model, torch.randn(16, 1, 112, 92), torch.randint(0, 40, (16,)), reps=2)
    assert sum(l.forward_s for l in prof.layers) < prof.forward_s  # what the hooks alone see
    w = from_profile(prof, "facenet", "here")
    assert w.compute_s == pytest.approx(prof.forward_s + prof.backward_s, rel=1e-9)
    assert w.optimizer_s == pytest.approx(sum(l.update_s for l in prof.layers)) and w.optimizer_s > 0  # not in compute_s
    own = {l.name: l.forward_s for l in prof.layers}
    shares = [wl.forward_s / own[wl.name] for wl in w.layers if own[wl.name] > 0]
    assert max(shares) == pytest.approx(min(shares))  # spread in proportion: the order of layers' costs kept


def test_bad_profiles_and_clusters_are_one_line(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("name: x\nbatch: 8\nlayers: [{name: a, params: 10}]\n")
    with pytest.raises(ConfigError, match="has no forward_s/backward_s"):
        load_workload(str(f))
    with pytest.raises(ConfigError, match="no such file or shipped profile"):
        load_workload("nope")
    with pytest.raises(ConfigError, match="--net fast"):
        load_cluster(None, {"net": "fast"})
    # a cluster file's faults name the file and its key (they were a YAML or pydantic traceback,
    # or an unknown key read as a flag, '--nett 1gbit')
    c = tmp_path / "c.yaml"
    for text, msg in (("workers: 8\nnett: 1gbit\n", "c.yaml: nett: 1gbit: not a cluster key; known: workers, net,"),
                      ("workers: [8\n", "c.yaml: not YAML: while parsing"), ("just text\n", "not a str"),
                      ("slowdown: [1, 0.5]\n", "c.yaml: slowdown: [1, 0.5]: every factor must be >= 1")):
        c.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(msg)) as e:
            load_cluster(str(c), {"workers": None})
        assert "\n" not in str(e.value)
    c.write_text("workers: 8\nslowdown: [1, 0.5]\n")  # a flag over the file's key: the flag is judged
    assert load_cluster(str(c), {"slowdown": "1,2"}).slowdowns()[:3] == [1.0, 2.0, 1.0]
    with pytest.raises(ConfigError, match=re.escape("--workers 0: Input should be greater than or equal to 1")):
        load_cluster(str(c), {"workers": 0, "slowdown": "1,2"})
    import argparse

    from ringps.cli.simulate import add_arguments, options

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(ConfigError, match="--run-steps 0: the run's length"):
        options(p.parse_args(["--run-steps", "0"]))
    with pytest.raises(ConfigError, match=r"--exact-tail 1.0: a fraction"):
        options(p.parse_args(["--exact-tail", "1"]))
    assert options(p.parse_args(["--run-steps", "150"])).tail_from == 90
    # the strategy settings have `ringps train`'s bounds (--density 2 and --steps 0 used to run:
    # the first predicted a step sending twice the model, the second a statistics traceback)
    for flags, msg in ((["--density", "2"], "--density 2.0: must be <= 1.0"), (["--density", "0"], "must be > 0"),
                       (["--staleness-threshold", "-1"], "must be >= 0"), (["--powersgd-rank", "0"], "must be >= 1"),
                       (["--local-period", "0"], "must be >= 1"), (["--steps", "0"], "--steps 0: steps"),
                       (["--sparse-progress", "0"], "--sparse-progress 0.0: must be > 0.0")):
        with pytest.raises(ConfigError, match=re.escape(msg)):
            options(p.parse_args(flags))
    assert options(p.parse_args(["--density", "1", "--staleness-threshold", "0"])).density == 1.0
    assert options(p.parse_args(["--sparse-progress", "0.9"])).sparse_progress == 0.9  # train's flag, the same key


def test_simulate_cli_prints_json_per_strategy():
    r = subprocess.run([sys.executable, "-m", "ringps", "simulate", "--profile", "facenet", "--workers", "16", "--net",
                        "10gbit", "--strategy", "allreduce,ps-threshold", "--steps", "5", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["strategy"] for x in rows] == ["allreduce", "ps-threshold"]
    for x in rows:
        assert {"strategy", "workers", "step_s", "utilization", "bytes_per_step", "time_to_accuracy_s"} <= set(x)
    assert "staleness_histogram" in rows[1] and "drop_fraction" in rows[1]


def test_a_profile_without_steps_to_its_target_says_how_to_get_a_time_to_accuracy(tmp_path):
    """A user's own profile (`ringps profile --out`) has no steps to the target: the footer said
    '0 dense steps at 8 workers'; it now says what to add."""
    f = tmp_path / "mine.yaml"
    f.write_text("name: mine\nbatch: 16\nlayers: [{name: a, params: 100000, forward_s: 0.001, backward_s: 0.002}]\n")
    r = subprocess.run([sys.executable, "-m", "ringps", "simulate", "--profile", str(f), "--workers", "8", "--strategy",
                        "allreduce"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "time-to-accuracy: not predicted, mine has no steps to its target: add steps_to_target" in out
    assert "0 dense steps" not in out
    plan = subprocess.run([sys.executable, "-m", "ringps", "plan", "--auto", "--profile", str(f), "--workers", "8"],
                          capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    assert "so ranked by step time alone" in " ".join(plan.stdout.split()) and "inf s" not in plan.stdout


def test_auto_recommends_the_plainest_update_among_the_models_ties():
    """`recommend`: candidates within the resolution of the fastest are ties to the model, and the
    plainest (CANDIDATES' order: all-reduce, 16 bits, low-rank, sparse, local steps, servers) is
    recommended (hand-computed: PowerSGD 0.5% ahead of fp16 gives fp16, as at 4 workers, 1 Gbit/s,
    1,1,2,4 in RESULTS §6; 6% ahead stays PowerSGD); 0: the fastest. `rank` puts the
    recommendation first and the rest fastest first; `reasons` says why it is not the fastest."""
    from ringps.sim.auto import PLAIN_ORDER, rank, reasons, recommend

    tied = {"powersgd (powersgd_rank=2)": 66.1, "fp16": 66.2, "ring-topk (density=0.01)": 68.8, "allreduce": 81.1}
    assert recommend(tied) == "fp16" and recommend(tied, 0.0) == "powersgd (powersgd_rank=2)"
    assert recommend({**tied, "fp16": 70.1}) == "powersgd (powersgd_rank=2)"  # 6% behind: not a tie
    assert recommend({**tied, "allreduce": 66.5}) == "allreduce"  # within 5% of the fastest too: plainer still
    assert recommend({"fp16": math.inf, "allreduce": math.inf}) == "fp16"  # nothing finite: the fastest, as sorted
    assert PLAIN_ORDER.index("allreduce") < PLAIN_ORDER.index("fp16") < PLAIN_ORDER.index("powersgd (powersgd_rank=2)") \
        < PLAIN_ORDER.index("ring-topk (density=0.01)") < PLAIN_ORDER.index("localsgd (local_period=4)") < PLAIN_ORDER.index("ps-async")
    # at 100 Mbit/s ring-topk is the fastest by far; a resolution of 200% makes PowerSGD (~2.8x slower) a tie
    w, c = load_workload("facenet"), ClusterSpec(workers=4, net="100mbit", shared_cores=2)
    prog = Progress(dense_steps=55, workers_ref=4)
    fastest = rank(w, c, prog, resolution=0.0, with_ps=False)
    loose = rank(w, c, prog, resolution=2.0, with_ps=False)
    times = {ch.label(): ch.tta for ch in fastest}
    assert [ch.tta for ch in fastest] == sorted(ch.tta for ch in fastest)
    assert fastest[0].label() == "ring-topk (density=0.01)" == rank(w, c, prog, with_ps=False)[0].label()
    assert loose[0].label() == recommend(times, 2.0) != fastest[0].label() and loose[0].strategy == "powersgd"
    assert [ch.label() for ch in loose[1:]] == [ch.label() for ch in fastest if ch.label() != loose[0].label()]
    why = reasons(loose)
    assert why.startswith(loose[0].label()) and f"{fastest[0].label()} is predicted" in why and "resolution" in why
    assert "resolution" not in reasons(fastest)


def test_plan_auto_takes_the_cluster_as_simulate_does(tmp_path):
    """`ringps plan --auto` describes the cluster with `ringps simulate`'s flags and file (it had
    only --workers, --net, --servers, --slowdown and --compute-scale: no nodes, no --cluster), a
    flag over the file's key; the cluster flags with --here, which prices this machine, are one line."""
    def plan(*flags):
        return subprocess.run([sys.executable, "-m", "ringps", "plan", "--auto", *flags], capture_output=True, text=True,
                              timeout=120)

    nodes = plan("--workers", "16", "--net", "25gbit", "--node-size", "4", "--intra-net", "600gbit")
    assert nodes.returncode == 0, nodes.stderr
    assert "on 16 workers, 25gbit links, nodes of 4 (600gbit inside)" in nodes.stdout
    f = tmp_path / "c.yaml"
    f.write_text("workers: 12\nnet: 10gbit\nslowdown: [1, 2]\n")
    r = plan("--cluster", str(f), "--workers", "6")
    assert r.returncode == 0, r.stderr
    assert "on 6 workers, 10gbit links, slowdown [1.0, 2.0]" in r.stdout and "recommended: " in r.stdout
    bad = plan("--here", "--node-size", "2")
    assert bad.returncode == 2 and "--node-size describes a cluster for `ringps plan --auto` without --here" in bad.stderr
    missing = plan("--here", "--calibration", str(tmp_path / "none.yaml"))  # plan's own flag, not train's
    assert missing.returncode == 2 and missing.stderr.startswith(f"ringps: --calibration {tmp_path / 'none.yaml'}: no such file")
    # `ringps train`'s --sparse-progress prices ring-topk's sparse steps here too, with train's bounds
    def ring_line(out):
        return next(line for line in out.splitlines() if "ring-topk (density=0.01)" in line and "│" in line)

    own, told = plan("--workers", "16", "--net", "1gbit"), plan("--workers", "16", "--net", "1gbit", "--sparse-progress", "1")
    assert own.returncode == 0 and told.returncode == 0, own.stderr + told.stderr
    assert ring_line(own.stdout) != ring_line(told.stdout)
    too = plan("--workers", "16", "--sparse-progress", "3")
    assert too.returncode == 2 and too.stderr.strip() == "ringps: --sparse-progress 3.0: must be <= 1.0"


def test_an_exchanges_own_cpu_delays_the_step_even_where_its_wire_hides():
    """Selection and scatter-adds run on the worker's CPU beside the backward, so they delay the
    step second for second, as the hook's cost model counts them (cpu_share 1); only the wire
    hides behind the backward. They used to hide with it: ring-topk's and the top-k all-gather's
    steps at 100 Mbit/s came out 13-21% short on 3-4 workers."""
    from ringps.cost import CostParams

    w = load_workload("facenet")
    c = ClusterSpec(workers=4, net="10gbit", compute_scale=10.0)  # a backward of ~0.6 s: the wire hides
    step = {s: simulate("topk-allgather", w, c, Options(cpu=CostParams(select_s=s)), Progress(), steps=6).step_s
            for s in (0.0, 20e-9)}
    assert step[20e-9] - step[0.0] == pytest.approx(10_618_368 * 20e-9, rel=0.02)


def test_powersgds_products_are_priced_without_a_calibration():
    """PowerSGD's own CPU is itemised from the device's constants, as the exchanges' is: 3 passes
    over each bucket (error in, input kept, error out) and, over each compressed matrix, a pass and
    rank multiply-adds an entry in each of its 3 products. On a link so fast that no wire is left
    to hide it (the CPU runs after the backward, beside the last collective), the step grows by
    exactly that against a device whose constants are 0, and a higher rank costs more. An
    uncalibrated prediction used to price PowerSGD's step by its bytes alone. fp16's casts and
    DDP's own all-reduce stay unitemised (engine.py: on these hosts the casts cost what half the
    bytes save)."""
    from ringps.cost import CostParams

    w = load_workload("facenet")
    c = ClusterSpec(workers=4, net="1000gbit", compute_scale=10.0)  # the last all-reduce beside the CPU: ~0
    free, dev = CostParams(pass_s=0.0, flop_s=0.0), CostParams(pass_s=1e-9, flop_s=1e-10)
    matrices = sum(layer.params for layer in w.layers if layer.params >= Options().dense_below)

    def step(strategy, cpu, **kw):  # PowerSGD from its first step: its warm-up is priced apart
        return simulate(strategy, w, c, Options(cpu=cpu, powersgd_start_iter=0, **kw), Progress(), steps=6).step_s

    grown = {}
    for r in (2, 8):
        hand = 3 * w.params * 1e-9 + 3 * matrices * (1e-9 + r * 1e-10)
        grown[r] = step("powersgd", dev, powersgd_rank=r) - step("powersgd", free, powersgd_rank=r)
        assert grown[r] == pytest.approx(hand, rel=0.02)
    assert grown[8] > grown[2] > 0.06  # facenet: 0.070 and 0.089 s a step at these constants
    for strategy in ("allreduce", "fp16"):
        assert step(strategy, dev) == pytest.approx(step(strategy, free), rel=1e-6)


def test_the_simulated_cost_model_weighs_compute_as_the_hook_does():
    """At 1 Gbit/s on facenet with 4 workers on 2 shared cores, pricing every sparse step at 0.57
    of a dense one, the hook sends every bucket dense in 16 bits (dense-fp16, DDP's fp16 hook:
    docs/RESULTS.md §1) whatever the values' dtype; at 100 Mbit/s sparse. The simulator, told the
    same, chooses the same."""
    from ringps.sim.cluster import ClusterSpec
    from ringps.sim.engine import Options
    from ringps.sim.predict import Progress, simulate
    from ringps.sim.workload import load_workload

    w = load_workload("facenet")
    c = ClusterSpec(workers=4, net="1gbit", compute_scale=1.67, shared_cores=2, efficiency=0.7, latency_s=2e-4)
    fp32 = simulate("ring-topk", w, c, Options(sparse_progress=0.57), Progress(), steps=4)
    fp16 = simulate("ring-topk", w, c, Options(value_bytes=2, sparse_progress=0.57), Progress(), steps=4)
    ddp16 = simulate("fp16", w, c, Options(), Progress(), steps=4)
    assert fp32.extra["sparse_share"] == 0.0 and fp16.extra["sparse_share"] == 0.0
    # fp16 DDP's bytes, but for the small tensors that wait for the fused fp32 message
    assert ddp16.bytes_per_step < fp32.bytes_per_step < 1.1 * ddp16.bytes_per_step
    slow = ClusterSpec(workers=4, net="100mbit", compute_scale=1.67, shared_cores=2, efficiency=0.7, latency_s=2e-4)
    assert simulate("ring-topk", w, slow, Options(sparse_progress=0.57), Progress(), steps=4).extra["sparse_share"] > 0.9


def test_a_periodic_run_is_measured_over_whole_periods_with_its_own_options(tmp_path):
    """DiLoCo's median step is an inner step; its mean over periods carries the outer all-reduce,
    which is what the simulator predicts (and the run's H, not the default, is what it is told)."""
    import yaml

    from ringps.config import Config
    from ringps.sim.calibrate import read_run

    cfg = Config().model_dump(mode="json")
    cfg["strategy"].update(strategy="diloco", local_period=4)
    cfg["run"]["net"] = "100mbit"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "summary.json").write_text(json.dumps({"step_s_median": 0.1, "time_to_accuracy_s": None}))
    t, rows = 0.0, []
    for step in range(1, 10):  # 0.1 s inner steps, every 4th 1.3 s (the outer all-reduce)
        t += 1.3 if step % 4 == 0 else 0.1
        rows.append({"kind": "step", "worker": 0, "step": step, "t": t, "compute_s": 0.1})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    m = read_run(tmp_path)
    assert m.options.local_period == 4
    assert m.step_s == pytest.approx((3 * 0.1 + 1.3) / 4)  # steps 1..9: two whole periods from step 1


def test_warm_up_steps_are_priced_as_what_they_run():
    """PowerSGD's first steps are plain all-reduce: at 100 Mbit/s they dominate a short run."""
    w, c = load_workload("facenet"), ClusterSpec(workers=4, net="100mbit")
    prog = Progress(dense_steps=55, factor={"powersgd": 1.0})
    cold = simulate("powersgd", w, c, Options(powersgd_start_iter=10), prog, steps=6)
    none = simulate("powersgd", w, c, Options(powersgd_start_iter=0), prog, steps=6)
    dense = simulate("allreduce", w, c, Options(), prog, steps=6)
    assert cold.step_s == pytest.approx(none.step_s)  # the steady state is the same
    extra = cold.extra["time_to_accuracy_s"] - none.extra["time_to_accuracy_s"]
    assert extra == pytest.approx(10 * (dense.step_s - none.step_s), rel=0.02)
    # ring-topk's density ramp: 2 epochs of 280 samples at 16 x 4 a step = 10 steps
    assert simulate("ring-topk", w, c, Options(), prog, steps=6).extra["warmup_steps"] == 10


def test_a_profiles_device_rates_price_the_strategies_own_work():
    """The strategies' own work (PowerSGD's passes and products, ring-topk's selection) was priced
    at this host's CPU costs whatever device a profile came from: resnet101-p100's PowerSGD took
    317 ms of a P100's 473 ms step. A profile's `kernels` (its device's memory bandwidth and FP32
    rate) scale this host's costs by this host's rates over the device's: hand-computed at ten
    times this host's rates, PowerSGD's own work is a tenth; a run's recorded constants (what
    ring-topk measured) still win over the profile's; the servers stay host CPUs."""
    from ringps.cost import CostParams
    from ringps.sim.workload import HOST_FP32_TFLOPS, HOST_MEMORY_GB_S, Kernels

    fast = Kernels(memory_gb_s=10 * HOST_MEMORY_GB_S, fp32_tflops=10 * HOST_FP32_TFLOPS).cost_params()
    d = CostParams()
    for k in ("pass_s", "reduce_s", "select_s", "scatter_s", "flop_s"):
        assert getattr(fast, k) == pytest.approx(getattr(d, k) / 10)
    assert Kernels(memory_gb_s=HOST_MEMORY_GB_S, fp32_tflops=1.0, select_s=7e-9).cost_params().select_s == 7e-9  # given wins
    base = load_workload("facenet")
    assert base.kernels is None
    w = base.model_copy(update={"kernels": Kernels(memory_gb_s=10 * HOST_MEMORY_GB_S, fp32_tflops=10 * HOST_FP32_TFLOPS)})
    c = ClusterSpec(workers=4, net="100000gbit", compute_scale=10.0)  # the last all-reduce beside the CPU: ~0
    free = CostParams(pass_s=0.0, flop_s=0.0)
    matrices = sum(layer.params for layer in w.layers if layer.params >= Options().dense_below)

    def exposed(wl, cpu=None):  # the CPU after the backward; with none, the collectives' latency (0.6 ms)
        return simulate("powersgd", wl, c, Options(cpu=cpu, powersgd_start_iter=0), Progress(), steps=6).exposed_s

    hand = 3 * w.params * 1e-10 + 3 * matrices * (1e-10 + 4 * 1e-11)  # rank 4 at a tenth of the host's costs
    assert exposed(w, free) < 0.1 * hand
    assert exposed(w) == pytest.approx(hand, rel=0.02)
    assert exposed(base) == pytest.approx(10 * hand, rel=0.02)  # no kernels: the host's
    assert exposed(w, CostParams()) == pytest.approx(exposed(base), rel=1e-9)  # a run's own constants win
    # the shipped P100 profile: PowerSGD's own work is milliseconds of its 473 ms step, not 317 ms
    p100 = load_workload("resnet101-p100")
    assert p100.kernels.memory_gb_s == 732 and "datasheet" in p100.kernels.source
    big = ClusterSpec(workers=64, net="10gbit")
    pred = {s: simulate(s, p100, big, Options(), Progress(), steps=6) for s in ("powersgd", "fp16")}
    assert pred["powersgd"].exposed_s < 0.03 and pred["powersgd"].step_s < 1.05 * pred["fp16"].step_s
    ps = [simulate("ps-sync", wl, ClusterSpec(workers=4, net="1gbit", servers=1), Options(), Progress(), steps=6).step_s
          for wl in (base, w)]
    assert ps[0] == pytest.approx(ps[1], rel=1e-9)  # the servers' update is a host CPU's either way


def test_bad_kernels_and_a_measured_profiles_kernels(tmp_path):
    """A profile's kernels need the device's rates or the constants themselves: one line naming the
    key. `ringps profile` measures its device's rates and writes them."""
    f = tmp_path / "p.yaml"
    head = "name: x\nbatch: 8\nlayers: [{name: a, params: 10, forward_s: 0.001, backward_s: 0.002}]\n"
    for kernels, msg in (("{}", "kernels: give memory_gb_s (the device's memory bandwidth) or pass_s"),
                         ("{memory_gb_s: 900}", "kernels: give fp32_tflops (the device's FP32 rate) or flop_s"),
                         ("{memory_gb_s: 0, fp32_tflops: 1}", "kernels.memory_gb_s: Input should be greater than 0"),
                         ("{memory_gb_s: 900, fp32_tflops: 15, tflops: 1}", "kernels.tflops: Extra inputs")):
        f.write_text(head + f"kernels: {kernels}\n")
        with pytest.raises(ConfigError, match=re.escape(msg)) as e:
            load_workload(str(f))
        assert "\n" not in str(e.value)
    out = tmp_path / "mlp.yaml"
    r = subprocess.run([sys.executable, "-m", "ringps", "profile", "--model", "mlp", "--dataset", "orl-faces",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    k = load_workload(str(out)).kernels
    assert k.memory_gb_s > 1 and k.fp32_tflops > 0.001 and "ringps profile" in k.source
    assert k.cost_params().pass_s > 0


def test_a_profile_on_a_device_that_is_not_here_is_one_line(tmp_path):
    """`ringps profile --device` names where to time the model: a GPU that this machine lacks, or a
    name that is no device ringps profiles on, is one line saying what to do, and writes nothing."""
    import torch

    from ringps.cli.profile import profile_device

    assert profile_device("cpu") == torch.device("cpu")
    cases = [("tpu", "--device tpu: not a device; use cpu, cuda or cuda:N"),
             ("meta", "--device meta: ringps profiles on cpu or cuda")]
    if not torch.cuda.is_available():
        cases.append(("cuda", "--device cuda: no CUDA device here"))
    for name, msg in cases:
        with pytest.raises(ConfigError, match=re.escape(msg)):
            profile_device(name)
    out = tmp_path / "p.yaml"
    r = subprocess.run([sys.executable, "-m", "ringps", "profile", "--model", "mlp", "--device", cases[-1][0],
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and cases[-1][1] in r.stderr
    assert not out.exists()
