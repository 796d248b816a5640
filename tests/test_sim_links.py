"""The simulator's shared links and parameter servers: a link's shares against hand-computed
transfers, the servers' processes on shared cores, their compute and loopback efficiency fitted
apart, lossy emulated links, and the link-sharing flags on the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from helpers import toy

from ringps.sim.cluster import ClusterSpec
from ringps.sim.engine import Options
from ringps.sim.predict import Progress, simulate
from ringps.sim.workload import load_workload


def run_link(fairness: float, arrivals: list[tuple[float, float]], rate: float = 1.0, cap=None) -> list[float]:
    """When each transfer (start time, bytes) through one SharedLink is done."""
    import simpy

    from ringps.sim.link import SharedLink

    env = simpy.Environment()
    link, done = SharedLink(env, rate, cap=cap, fairness=fairness), [0.0] * len(arrivals)

    def go(i, t0, n):
        yield env.timeout(t0)
        yield env.process(link.transfer(n))
        done[i] = env.now

    for i, (t0, n) in enumerate(arrivals):
        env.process(go(i, t0, n))
    env.run()
    return done


def test_shared_link_against_hand_computed_shares():
    # two at once: equal shares finish together at 2S/R; first come first served at S/R and 2S/R
    assert run_link(1.0, [(0, 1.0), (0, 1.0)]) == pytest.approx([2.0, 2.0])
    assert run_link(0.0, [(0, 1.0), (0, 1.0)]) == pytest.approx([1.0, 2.0])
    # B joins halfway through A's transfer: A alone for 0.5, then halves; A done at 1.5, B at 2.0
    assert run_link(1.0, [(0, 1.0), (0.5, 1.0)]) == pytest.approx([1.5, 2.0])
    # weights 1 and 1/3: the first gets 3/4 of the link until it is done (4/3), the second the rest
    assert run_link(1 / 3, [(0, 1.0), (0, 1.0)]) == pytest.approx([4 / 3, 2.0])
    # a transfer moves no faster than its sender's own link (cap)
    assert run_link(1.0, [(0, 1.0)], rate=4.0, cap=0.5) == pytest.approx([2.0])


def test_parameter_server_processes_share_the_emulated_cores():
    """On an emulated cluster's shared cores a push cycle's compute and the server's updates are
    processor-shared (a fast link, so the transfers take ~0): 4 workers of 1 s compute on 2 cores
    take 2 s a cycle (1 s with a device each); with 1 s of update per push (4 passes over 1e6
    values at 2.5e-7 s) and 1 core, 2 workers need 2 x (1 + 1) core-seconds a cycle: 4 s, where
    a device each overlaps one's compute with the other's update under the lock: 2 s."""
    from ringps.cost import CostParams

    w, fast = toy(), {"net": "1000gbit", "latency_s": 0.0, "efficiency": 1.0}
    def cycle(workers, cores, o=Options()):
        return simulate("ps-async", w, ClusterSpec(workers=workers, shared_cores=cores, **fast), o, Progress(), steps=40).step_s

    assert cycle(4, 2) == pytest.approx(2.0, rel=0.03) and cycle(4, None) == pytest.approx(1.0, rel=0.03)
    heavy = Options(cpu=CostParams(pass_s=2.5e-7))
    assert cycle(2, 1, heavy) == pytest.approx(4.0, rel=0.03) and cycle(2, None, heavy) == pytest.approx(2.0, rel=0.03)


def test_calibration_fits_a_parameter_server_workers_compute_apart():
    """A synchronous step's compute carries the collective's CPU beside the backward; a push
    comes after it: each strategy family predicts with its own compute scale."""
    from pathlib import Path

    from ringps.sim.calibrate import Measured, cluster_for, fit

    w = load_workload("facenet")
    runs = [Measured(Path(f"/r/{s}"), s, 2, 1, None, None, c * w.compute_s, 1.0, None, None, 0, "facenet", {})
            for s, c in (("allreduce", 3.6), ("fp16", 3.8), ("ps-async", 2.4), ("ps-sync", 2.6))]
    f = fit(runs, w)
    assert f.compute_a == pytest.approx(3.7) and f.ps_compute_a == pytest.approx(2.5)
    assert cluster_for(runs[0], f).compute_scale == pytest.approx(3.7)
    assert cluster_for(runs[2], f).compute_scale == pytest.approx(2.5)


def test_the_servers_loopback_efficiency_is_fitted_past_its_stand_in_rate():
    """On loopback a push is a copy between processes, which the model stands in for with a
    10 Gbit/s link: a machine whose pushes move 4x faster is fitted at 4x (it was capped at 1,
    and the loopback parameter-server cells came out 23-79% slow). Shaped links stay <= 1."""
    from pathlib import Path

    from ringps.sim.calibrate import Fitted, Measured, fit_server_efficiency, predict_step

    w = load_workload("facenet")
    f = Fitted(3.0, efficiency=0.9, ps_compute_a=0.3)  # compute small against a 43 MB push and reply
    runs = [Measured(Path(f"/r/{s}"), s, 2, 1, net, None, 0.3 * w.compute_s, 1.0, None, None, 0, "facenet", {})
            for s, net in (("ps-async", None), ("ps-async", "1gbit"))]
    truth = {"loopback": 4.0, "1gbit": 0.8}
    runs = [replace(m, step_s=predict_step(m, w, replace(f, server_efficiency=truth))) for m in runs]
    fitted = fit_server_efficiency(runs, w, f)
    assert fitted["loopback"] == pytest.approx(4.0, rel=0.02) and fitted["1gbit"] == pytest.approx(0.8, rel=0.02)
    assert runs[0].step_s < 0.7 * predict_step(runs[0], w, replace(f, server_efficiency={"loopback": 1.0}))


def test_two_workers_sharing_a_server_link_fairly_stay_in_step():
    # compute 1 s, a push and a reply of 1 s alone (4 MB at 4 MB/s). Fair shares: both push at
    # once (2 s), then both replies (2 s): 5 s a cycle, as measured on the emulated cluster at
    # 1 Gbit/s. Taking turns (lossy links): one worker's push overlaps the other's reply: 3 s.
    w = toy(step_s=1.0, params=1_000_000)
    fair = simulate("ps-async", w, ClusterSpec(workers=2, net="32mbit", efficiency=1.0), Options(), Progress(), steps=12)
    turns = simulate("ps-async", w, ClusterSpec(workers=2, net="32mbit", efficiency=1.0, fairness=0.0), Options(),
                     Progress(), steps=12)
    assert fair.step_s == pytest.approx(5.0, rel=0.03)
    assert turns.step_s == pytest.approx(3.0, rel=0.05)


def test_emulated_links_are_lossy_where_the_queue_holds_less_than_a_flow_keeps_in_flight(monkeypatch):
    from ringps.sim import calibrate

    monkeypatch.setattr(calibrate, "in_flight_ceiling", lambda: 4 << 20)
    # tbf's 200 ms queue: 2.5 MB at 100 Mbit/s (overflows), 25 MB at 1 Gbit/s (never fills)
    assert calibrate.lossy("100mbit") and not calibrate.lossy("1gbit") and not calibrate.lossy(None)


def test_a_runs_own_cost_model_inputs_are_what_its_prediction_plans_with():
    from ringps.sim.calibrate import options_of

    cfg = {"strategy": {"strategy": "ring-topk"}, "compress": {"density": 0.02}}
    summary = {"strategy_stats": {"rank0": {"compute_s": 0.145, "cost_params": {
        "bandwidth": 1.2e7, "latency": 1e-4, "select_s": 2.7e-9, "scatter_s": 3e-9, "pass_s": 2e-10,
        "reduce_s": 3e-10, "flop_s": 1e-10, "cpu_share": 1.0}}}}
    o = options_of(cfg, summary)
    assert o.plan_compute_s == 0.145 and o.cpu.select_s == 2.7e-9 and o.density == 0.02
    assert options_of(cfg).plan_compute_s is None  # a run without a record plans with the model's compute


def test_link_sharing_flags_reach_the_cluster_and_bad_values_get_one_line():
    def start(*a):  # the four commands side by side: each is mostly torch's imports
        return subprocess.Popen([sys.executable, "-m", "ringps", "simulate", "--profile", "facenet", "--workers", "2",
                                 "--net", "100mbit", "--strategy", "ps-async", "--json", *a],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = [start(), start("--fairness", "0"), start("--server-efficiency", "0.5"), start("--fairness", "2")]
    (even, turns, slow_link, bad) = [(p, *p.communicate(timeout=180)) for p in procs]  # (process, stdout, stderr)
    assert {even[0].returncode, turns[0].returncode, slow_link[0].returncode} == {0}, even[2] + turns[2] + slow_link[2]
    step = lambda r: json.loads(r[1].strip().splitlines()[-1])["step_s"]
    # two equal workers: taking turns pipelines one's push with the other's reply (faster); a
    # server link at half the payload rate makes every transfer take twice as long (slower)
    assert step(turns) < 0.8 * step(even) < step(even) < 0.8 * step(slow_link)
    assert bad[0].returncode == 2 and len(bad[2].strip().splitlines()) == 1 and "--fairness" in bad[2]
