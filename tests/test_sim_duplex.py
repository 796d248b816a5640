"""The simulator's duplex server link: each direction slower while the other carries transfers
(sim/link.py `pair`), measured apart by benchmarks/server_link.py (sim/calibrate.py
`duplex_from_probes`) and given to a cluster as `server_duplex`."""

from __future__ import annotations

import json

import pytest
import simpy

from ringps.errors import ConfigError
from ringps.sim.calibrate import Fitted, duplex_at, duplex_from_probes, emulated_cluster
from ringps.sim.cluster import ClusterSpec, load_cluster
from ringps.sim.engine import Options
from ringps.sim.link import SharedLink
from ringps.sim.predict import Progress, simulate
from ringps.sim.workload import load_workload


def run_pair(duplex: float, up: list[tuple[float, float]], down: list[tuple[float, float]]) -> tuple[list, list]:
    """When each (start, bytes) transfer on two paired links of rate 1 is done."""
    env = simpy.Environment()
    a, b = SharedLink(env, 1.0), SharedLink(env, 1.0)
    a.pair(b, duplex)
    done = {id(a): [0.0] * len(up), id(b): [0.0] * len(down)}

    def go(link, i, t0, n):
        yield env.timeout(t0)
        yield env.process(link.transfer(n))
        done[id(link)][i] = env.now

    for link, arrivals in ((a, up), (b, down)):
        for i, (t0, n) in enumerate(arrivals):
            env.process(go(link, i, t0, n))
    env.run()
    return done[id(a)], done[id(b)]


def test_paired_links_against_hand_computed_times():
    # one direction alone runs at its full rate, whatever the duplex factor
    assert run_pair(0.5, [(0, 1.0)], []) == ([pytest.approx(1.0)], [])
    # both at once: each at half its rate, done together at 2
    assert run_pair(0.5, [(0, 1.0)], [(0, 1.0)]) == (pytest.approx([2.0]), pytest.approx([2.0]))
    # the reply starts at 0.5: the push has 0.5 left, at 0.5 -> done at 1.5; the reply moved 0.5
    # by then and finishes alone at full rate: 2.0
    assert run_pair(0.5, [(0, 1.0)], [(0.5, 1.0)]) == (pytest.approx([1.5]), pytest.approx([2.0]))
    # duplex 1: the directions are independent
    assert run_pair(1.0, [(0, 1.0)], [(0, 1.0)]) == (pytest.approx([1.0]), pytest.approx([1.0]))


def test_duplex_from_probes_is_the_ratio_of_medians_pooled_over_files(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"1/push only": [0.95, 0.95], "1/push and reply": [0.90, 0.80],
                             "3/push only": [0.90], "3/push and reply": [0.99]}))
    b.write_text(json.dumps({"1/push and reply": [0.85], "1/reply only": [0.95]}))
    assert duplex_from_probes([a, b]) == {1: pytest.approx(0.85 / 0.95, abs=1e-4), 3: 1.0}  # at most 1
    # beyond the largest worker count measured, that one's; below the smallest, none
    assert duplex_at({2: 0.9, 4: 0.8}, 8) == 0.8 and duplex_at({2: 0.9, 4: 0.8}, 3) == 0.9
    assert duplex_at({2: 0.9}, 1) == 1.0 and duplex_at({}, 4) == 1.0
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not a server_link.py results.json"):
        duplex_from_probes([bad])
    with pytest.raises(ConfigError, match="no 'k/push only'"):
        duplex_from_probes([b])


def test_the_emulated_cluster_takes_the_duplex_only_on_a_lossy_link():
    f = Fitted(3.0, duplex={2: 0.95, 4: 0.85})
    assert emulated_cluster(4, "100mbit", None, 1, f, ps=True).server_duplex == 0.85
    assert emulated_cluster(4, "10gbit", None, 1, f, ps=True).server_duplex == 1.0
    with pytest.raises(ConfigError, match="--server-duplex 1.5"):
        load_cluster(None, {"server_duplex": 1.5})


def test_a_duplex_loss_slows_parameter_server_pushes_on_a_saturated_link():
    """4 workers on a 100 Mbit/s server link, pushes and replies overlapping: a duplex factor
    below 1 lengthens the cycle, and by no more than 1/factor."""
    w = load_workload("facenet")

    def step(d):
        c = ClusterSpec(workers=4, net="100mbit", fairness=0.0, server_duplex=d)
        return simulate("ps-async", w, c, Options(), Progress(), steps=12).step_s

    full, lossy = step(1.0), step(0.8)
    assert full * 1.02 < lossy <= full / 0.8 * 1.01


def test_calibrate_takes_the_measured_duplex_and_auto_prices_with_it(tmp_path, monkeypatch):
    """`ringps simulate --calibrate RUN... --duplex PROBE.json` writes the measured factors into the
    calibration file beside the fitted constants; read back (`--auto-calibration`), they pair the
    servers' links of a lossy emulated link as in the calibration, where before the file carried
    none and every server link ran both ways at full rate."""
    import subprocess
    import sys

    from helpers import finished_run

    from ringps.sim.calibrate import fitted_from
    from ringps.sim.predict import load_calibration

    probe = tmp_path / "server-link.json"
    probe.write_text(json.dumps({"2/push only": [0.95], "2/push and reply": [0.855],
                                 "4/push only": [0.95], "4/push and reply": [0.76]}))
    rows = [{"kind": "step", "worker": k % 2, "step": k // 2 + 1, "t": 2.0 * (k // 2 + 1), "compute_s": 0.4}
            for k in range(12)]
    runs = [str(finished_run(tmp_path / s, s, {"step_s_median": step, "time_to_accuracy_s": None}, rows,
                             net="100mbit", workers=2)) for s, step in (("allreduce", 3.9), ("ps-async", 8.5))]
    out = tmp_path / "fit.yaml"
    cmd = [sys.executable, "-m", "ringps", "simulate", "--calibrate", *runs, "--out", str(out)]
    r = subprocess.run([*cmd, "--duplex", str(probe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "each way while both are busy" in r.stdout
    f = fitted_from(load_calibration(str(out), "--auto-calibration"))
    assert f.duplex == {2: pytest.approx(0.9), 4: pytest.approx(0.8)}
    monkeypatch.setattr("ringps.sim.calibrate.in_flight_ceiling", lambda: 4 << 20)  # 100 Mbit/s's queue overflows
    assert emulated_cluster(4, "100mbit", None, 1, f, ps=True).server_duplex == pytest.approx(0.8)
    assert emulated_cluster(3, "100mbit", None, 1, f, ps=True).server_duplex == pytest.approx(0.9)
    # without --duplex the file has none: the links stay independent
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert fitted_from(load_calibration(str(out), "--auto-calibration")).duplex == {}
    # a probe that is not one, and --duplex without --calibrate: one line each, exit 2
    bad = tmp_path / "bad.json"
    bad.write_text("[")
    r = subprocess.run([*cmd, "--duplex", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a server_link.py results.json" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "ringps", "simulate", "--duplex", str(probe)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--server-duplex" in r.stderr
