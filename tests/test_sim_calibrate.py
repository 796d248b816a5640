"""`ringps simulate --calibrate` writes every machine constant it fits, and `--strategy auto`
prices the job with a calibration of its cluster or, without one, with its step timed here."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import finished_run

from ringps.errors import ConfigError, RingpsError
from ringps.sim.calibrate import emulated_cluster, fitted_from
from ringps.sim.predict import load_calibration, load_progress


def test_calibrate_cli_writes_every_machine_constant(tmp_path):
    """`ringps simulate --calibrate` on two run folders (allreduce and fp16, 2 workers at 1 Gbit/s,
    each with the host kernel's CPU per step recorded) writes the fitted constants, CPU per byte
    among them."""
    import yaml

    runs = []
    # kernel CPU per step: 0.25 s per second of step plus 7.5e-10 s per byte (2 workers x sent + received)
    for strategy, step, sent in (("allreduce", 1.0, 1e8), ("fp16", 0.8, 5e7)):
        kernel = 0.25 * step + 7.5e-10 * 2 * 2 * sent
        # the compute alternates 0.5 x e^(+-0.1) from step to step: a log sd of 0.1 x sqrt(6/5) over steps 2-6
        rows = [{"kind": "step", "worker": k % 2, "step": k // 2 + 1, "t": step * (k // 2 + 1),
                 "compute_s": 0.5 * math.exp(0.1 if k // 2 % 2 else -0.1)} for k in range(12)]
        runs.append(str(finished_run(tmp_path / strategy, strategy, {
            "step_s_median": step, "time_to_accuracy_s": None, "host_kernel_cpu_s_per_step": kernel,
            "bytes_sent_per_step": sent, "bytes_recv_per_step": sent}, rows, net="1gbit", workers=2)))
        # worker 0's trace: after a slow first step, 0.1 s forward, 0.3 s backward, 0.1 s optimizer
        spans = [(name, 1e6 * (d * 3 if k == 0 else d)) for k in range(6)
                 for name, d in (("forward", 0.1), ("backward", 0.3), ("exposed communication", 0.2), ("optimizer", 0.1))]
        (tmp_path / strategy / "trace").mkdir()
        (tmp_path / strategy / "trace" / "rank-0.json").write_text(json.dumps({"traceEvents": [
            {"name": "process_name", "ph": "M", "args": {"name": "rank 0"}},
            *({"name": n, "ph": "X", "ts": 1e6 * i, "dur": d, "pid": 0, "tid": 0} for i, (n, d) in enumerate(spans))]}))
    out = tmp_path / "fit.yaml"
    r = subprocess.run([sys.executable, "-m", "ringps", "simulate", "--calibrate", *runs, "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(out.read_text())
    # the host kernel's CPU per byte is measured and reported, not charged: the runs carry it
    assert doc["cpu_per_byte"] == 0.0
    assert doc["cpu_s_itemised"] == ["powersgd"]  # its cpu_s is beyond the CPU the model itemises
    assert 0.05 < doc["efficiency"] <= 1 and doc["compute_a"] > 0
    printed = " ".join(r.stdout.split())  # as rich wrapped it, unwrapped
    assert "the host kernel's CPU per byte moved 7.5e-10 s (reported, not charged" in printed
    assert doc["jitter"] == pytest.approx(statistics.stdev([0.1, -0.1, 0.1, -0.1, 0.1]), rel=1e-3)
    assert doc["ps_compute_a"] is None  # no parameter-server run to fit it on
    assert "staleness_a" not in doc  # nor a price of staleness: the shipped model's stands (load_calibration)
    assert load_progress(str(out)).jitter == doc["jitter"]  # the file is what --progress reads back
    # the split of the compute, from the traces: what the shipped profile's own (71% backward) misses
    assert (doc["forward_share"], doc["optimizer_share"]) == pytest.approx((0.2, 0.2))
    assert "forward 20%, optimizer step 20%" in printed
    fitted = fitted_from(load_progress(str(out)))
    c = emulated_cluster(4, "1gbit", None, 1, fitted)
    assert (c.forward_share, c.optimizer_share) == (0.2, 0.2)
    assert emulated_cluster(4, "1gbit", None, 1, fitted, ps=True).optimizer_share is None  # a server steps for it


def test_auto_prices_the_job_with_a_calibration_of_its_cluster(tmp_path):
    """With a calibration of the cluster (`--auto-calibration`), auto prices the job with the
    file's machine constants, its processes sharing this machine's cores. Compute as the bare
    profile says (a 1.0) on a link that moves half its rate leaves the 43 MB exchange exposed at
    1 Gbit/s and a compressed exchange wins (at 0.85 fp16's half the bytes beats PowerSGD's priced
    products); at 4x the profile per whole core (this machine's) and 0.85 the exchange hides behind
    the backward and dense fp16 wins. The shipped progress factors stand in for the strategies the file did
    not fit."""
    from ringps.config import load_config
    from ringps.cost import cores
    from ringps.launch.run import resolve_auto

    job = {"model": "facenet", "dataset": "orl-faces", "workers": 4, "net": "1gbit", "strategy": "auto"}
    bare = tmp_path / "bare.yaml"
    bare.write_text("compute_a: 1.0\nefficiency: 0.5\n")
    _, plain = resolve_auto(load_config(None, {**job, "auto_calibration": str(bare)}))
    assert plain["chosen"].split(" ")[0] in ("topk-allgather", "ring-topk", "powersgd")
    assert plain["measured_step"] is None  # a calibration prices the machine: nothing is timed
    cal = tmp_path / "cal.yaml"
    cal.write_text("compute_a: 4.0\nefficiency: 0.85\nfactor: {powersgd: 0.9}\n")
    cfg, plan = resolve_auto(load_config(None, {**job, "auto_calibration": str(cal)}))
    assert plan["cluster"]["compute_scale"] == 4.0 and plan["cluster"]["shared_cores"] == cores()
    assert plan["chosen"] == "fp16" and cfg.strategy.strategy == "fp16"
    tta = {r["strategy"]: r["time_to_accuracy_s"] for r in plan["ranking"]}
    # the shipped factors the file did not fit (fp16's) stand beside its own (PowerSGD's): at 1 Gbit/s
    # fp16's half bytes make it faster than allreduce at its shipped progress
    assert tta["fp16"] < tta["allreduce"] and tta["powersgd (powersgd_rank=4)"] > tta["fp16"]
    # the shipped factors stand in where the file fitted none, its own win
    merged = load_calibration(str(cal), "--auto-calibration")
    assert merged.factor["powersgd"] == 0.9 and merged.factor["topk-allgather"] == load_progress(None).factor["topk-allgather"]
    # so does the price of staleness, where the file's runs had no asynchronous one to fit it on
    assert merged.staleness_a == load_progress(None).staleness_a
    cal.write_text(cal.read_text() + "staleness_a: 0.3\n")
    assert load_calibration(str(cal), "--auto-calibration").staleness_a == 0.3
    # `ringps plan --auto --here` prints the choice `ringps train --strategy auto` makes with the same flags
    out = subprocess.run([sys.executable, "-m", "ringps", "plan", "--auto", "--here", "--workers", "4", "--net", "1gbit",
                          "--calibration", str(cal)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "recommended: fp16: predicted time-to-accuracy" in " ".join(out.stdout.split())
    # without --net it prices what `ringps train` without --net runs: the unshaped loopback
    bare_net = subprocess.run([sys.executable, "-m", "ringps", "plan", "--auto", "--here", "--workers", "4",
                               "--calibration", str(cal)], capture_output=True, text=True, timeout=120)
    assert bare_net.returncode == 0, bare_net.stderr
    assert "on 4 workers, loopback (priced as 10gbit)" in bare_net.stdout and "1gbit" not in bare_net.stdout
    with pytest.raises(ConfigError, match="--auto-calibration .*no such file"):
        resolve_auto(load_config(None, {**job, "auto_calibration": str(tmp_path / "missing.yaml")}))
    # the job's --sparse-progress, which ring-topk's hook decides with, prices the plan too (it
    # was dropped: the plan priced each exchange's own while the run used the flag's)
    two = {**job, "workers": 2, "auto_calibration": str(cal)}
    ring = "ring-topk (density=0.01)"
    own = {r["strategy"]: r for r in resolve_auto(load_config(None, two))[1]["ranking"]}[ring]
    told_cfg, told = resolve_auto(load_config(None, {**two, "sparse_progress": 1.0}))
    assert {r["strategy"]: r for r in told["ranking"]}[ring]["time_to_accuracy_s"] != own["time_to_accuracy_s"]
    assert told_cfg.compress.sparse_progress == 1.0


def test_an_older_calibrations_cpu_for_what_the_model_now_itemises_is_replaced(tmp_path):
    """A calibration written before PowerSGD's products were itemised fitted them into cpu_s: read
    now, that entry gives way to the itemised price (else counted twice); a strategy's residual
    the model does not itemise (fp16's casts) stays, and a newer file keeps all of its own."""
    old = tmp_path / "old.yaml"
    old.write_text("compute_a: 2.0\ncpu_s: {fp16: 0.02, powersgd: 0.07, ring-topk: 0.01}\n")
    assert load_calibration(str(old), "--auto-calibration").cpu_s == {"fp16": 0.02, "ring-topk": 0.01}
    assert load_progress(str(old)).cpu_s == {"fp16": 0.02, "ring-topk": 0.01}  # as `ringps simulate --progress` reads it
    new = tmp_path / "new.yaml"
    new.write_text(old.read_text() + "cpu_s_itemised: [powersgd]\n")
    assert load_calibration(str(new), "--auto-calibration").cpu_s == {"fp16": 0.02, "powersgd": 0.07, "ring-topk": 0.01}


def test_auto_without_a_calibration_times_the_jobs_step_here():
    """Without a calibration file auto times the job's own step on this machine (its model, batch,
    loss and optimizer, in processes of their own, as many at once as the job's) and prices the profile by it: the profile times
    only the layers that own parameters, and the machine's speed is the one the job will see."""
    from ringps.config import load_config
    from ringps.cost import cores
    from ringps.launch.run import resolve_auto
    from ringps.sim.workload import load_workload

    job = {"model": "facenet", "dataset": "orl-faces", "workers": 4, "net": "1gbit", "strategy": "auto"}
    cfg, plan = resolve_auto(load_config(None, job))
    m = plan["measured_step"]
    assert m["steps"] == 6 and m["compute_s"] > 0 and m["optimizer_s"] > 0
    profile = load_workload("facenet").compute_s
    assert m["profile_compute_s"] == pytest.approx(profile)
    # timed by the job's 4 processes at once (2 cores here: the cap is twice the cores), then by the
    # same processes in DDP, all-reducing among themselves on loopback
    assert m["processes"] == min(4, 2 * cores())
    assert m["sync_step_s"] >= m["sync_compute_s"] > m["sync_forward_s"] + m["sync_optimizer_s"] > 0
    # a synchronous worker's compute: its DDP compute per whole core over the profile's, split as it
    # was there, the cores shared as in a run (calibration's fit from runs: fit_compute)
    c = plan["cluster"]
    per_core = m["sync_compute_s"] / max(1.0, m["processes"] / cores())
    assert c["compute_scale"] == pytest.approx(per_core / profile) and c["shared_cores"] == cores()
    assert c["forward_share"] == pytest.approx(m["sync_forward_s"] / m["sync_compute_s"])
    assert c["optimizer_share"] == pytest.approx(m["sync_optimizer_s"] / m["sync_compute_s"])
    # what the measured DDP step took beyond the model's DDP step among the same processes on
    # loopback is charged to every synchronous step: there the model's step is the measured one
    from ringps.sim.cluster import ClusterSpec
    from ringps.sim.engine import Options
    from ringps.sim.predict import Progress, simulate

    loop = ClusterSpec(**{**c, "workers": m["processes"], "net": "10gbit", "slowdown": None})
    bare, waited = (simulate("allreduce", load_workload("facenet"), loop.model_copy(update={"sync_wait_s": x}), Options(),
                             Progress(), steps=12).step_s for x in (0.0, c["sync_wait_s"]))
    assert c["sync_wait_s"] >= 0 and waited == pytest.approx(max(bare, m["sync_step_s"]))
    assert plan["ranking"][0]["strategy"] == plan["chosen"] and cfg.strategy.strategy == plan["chosen"].split(" ")[0]
    # ring-topk priced with the selection costs its hook will measure, measured here and recorded
    sel = plan["selection_costs"]
    assert set(sel) >= {"select_s", "scatter_s", "pass_s"} and all(v > 0 for v in sel.values())


def test_auto_times_the_selection_with_the_workers_threads(monkeypatch):
    """ring-topk's hook measures its per-element costs in a worker, at `--threads` intra-op
    threads; the launcher's torch has one per core, and timed there the passes and the selection
    cost half as much as in the hooks. Auto times them at the workers' threads, and leaves the
    launcher's as they were."""
    import torch

    import ringps.comm.probe as probe
    from ringps.launch.run import selection_costs

    seen = []
    monkeypatch.setattr(probe, "calibrate_cpu", lambda device=None: seen.append(torch.get_num_threads()) or {"select_s": 1e-9})
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert selection_costs(False, threads=1).select_s == 1e-9 and seen == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_auto_prices_only_the_selecting_strategies_with_the_measured_selection():
    """`rank`'s selection_cpu prices ring-topk's and the top-k all-gather's exchanges as the hook
    prices them; CostParams's defaults (select 5 ns, a pass 1 ns) charged facenet's sparse step at
    2 workers ~50 ms of CPU the runs did not spend, and auto picked fp16 where ring-topk was fastest.
    The other strategies' predictions do not move."""
    from ringps.cost import CostParams
    from ringps.sim.auto import rank
    from ringps.sim.cluster import ClusterSpec
    from ringps.sim.predict import Progress
    from ringps.sim.workload import load_workload

    w, c = load_workload("facenet"), ClusterSpec(workers=2, net="1gbit")
    cheap = CostParams(select_s=2e-9, pass_s=1e-10)
    default, measured = ({ch.label(): ch.prediction.step_s for ch in rank(w, c, Progress(), selection_cpu=s)}
                         for s in (None, cheap))
    assert default.keys() == measured.keys()
    for label in default:
        if label.split(" ")[0] in ("ring-topk", "topk-allgather"):
            # 10.6M elements selected at 3 ns less each, and the passes: the step ~30 ms shorter at least
            assert default[label] - measured[label] > 0.03, label
        else:
            assert measured[label] == default[label], label


def test_measuring_the_step_fails_in_one_line_and_leaves_no_process(tmp_path):
    from ringps.config import load_config
    from ringps.launch.measure import measure_step

    folders = set(Path(tempfile.gettempdir()).glob("ringps-measure-*"))  # another job's, if any
    cfg = load_config(None, {"model": "facenet", "dataset": "orl-faces", "workers": 2})
    with pytest.raises(RingpsError, match=r"took longer than 0\.5s; give --auto-calibration FILE"):
        measure_step(cfg, timeout=0.5, processes=2)
    bad = load_config(None, {"model": "mlp", "dataset": f"folder:{tmp_path / 'none'}", "workers": 2})
    with pytest.raises(RingpsError, match="needs at least two subfolders") as e:  # the job's own error
        measure_step(bad)
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    left = subprocess.run(["pgrep", "-f", "ringps.launch.measure"], capture_output=True, text=True).stdout.split()
    assert left == []
    assert set(Path(tempfile.gettempdir()).glob("ringps-measure-*")) <= folders  # its job file and barrier folder


def test_the_step_is_timed_by_the_processes_that_will_share_the_cores(tmp_path):
    """processes=2: both time their steps at once (the barrier lines them up) and the medians of
    both come back; a barrier whose other parties never arrive lets the one that did go on at its
    deadline rather than hang."""
    from ringps.config import load_config
    from ringps.launch.measure import _barrier, measure_step

    cfg = load_config(None, {"model": "mlp", "dataset": "orl-faces", "workers": 2})
    m = measure_step(cfg, steps=3, processes=2)
    assert m.processes == 2 and m.steps == 3 and m.compute_s > 0 and m.optimizer_s > 0
    # then in DDP over a gloo group of their own: the whole step, with its forward and optimizer parts
    assert m.sync_step_s >= m.sync_compute_s > m.sync_forward_s + m.sync_optimizer_s
    assert m.sync_forward_s > 0 and m.sync_optimizer_s > 0
    alone = measure_step(cfg, steps=3)  # one process: no group to all-reduce in
    assert alone.processes == 1 and alone.sync_step_s is None
    t0 = time.time()
    _barrier(str(tmp_path), 2, t0 + 0.3)
    assert 0.3 <= time.time() - t0 < 5 and len(list(tmp_path.iterdir())) == 1


def test_compute_per_core_comes_from_the_loopback_runs_where_there_are_any():
    """A shaped link's own CPU (the kernel's TCP and tbf, gloo's threads) runs beside a 2-worker
    run's backward on the same cores and lengthens its compute; the compute per whole core is the
    loopback runs' where there are any (the parameter-server runs have their own), else every
    synchronous run's."""
    from pathlib import Path

    from ringps.cost import contention
    from ringps.sim.calibrate import Measured, fit_compute

    def run(net, compute, strategy="allreduce"):
        return Measured(Path(strategy), strategy, 2, 1, net, None, compute, 0.5, None, None, 0, "facenet", {})

    shaped = [run("100mbit", 0.29), run("1gbit", 0.26)]
    runs = [*shaped, run(None, 0.22), run(None, 0.24, "fp16"), run(None, 0.1, "ps-async")]
    assert fit_compute(runs, 0.1) * contention(2) == pytest.approx(2.3)
    assert fit_compute(shaped, 0.1) * contention(2) == pytest.approx(2.75)
