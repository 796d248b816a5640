"""`--strategy auto` under torchrun: the ranks choose together once their group exists
(launch/auto_group.py). It was refused ("torchrun's ranks cannot agree"): each rank would have
chosen alone, on its own timing, before a group existed to agree in."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ringps.config import load_config
from ringps.cost import cores

JOB = {"model": "facenet", "dataset": "orl-faces", "strategy": "auto"}


def test_the_group_prices_its_measured_links_and_its_hosts(tmp_path):
    """Rank 0 prices the torchrun job on the links the group measured (payload rate: efficiency 1,
    the measured latency), WORLD_SIZE workers; on CPU the hosts' cores shared by their processes,
    the parameter servers among the ranks (WORLD_SIZE - servers workers); on CUDA a device each and
    only the collective strategies (a parameter server's ranks talk gloo). At 100 Mbit/s a
    compute-light job's 43 MB exchange is exposed and ring-topk wins; at 100 Gbit/s every exchange
    hides, fp16 makes allreduce's update in as many steps, and the plainer of the tie wins."""
    from ringps.launch.auto_group import _choose
    from ringps.launch.run import auto_choices

    cal = tmp_path / "cal.yaml"
    cal.write_text("compute_a: 1.0\n")
    cfg = load_config(None, {**JOB, "workers": 8, "servers": 2, "auto_calibration": str(cal)})
    slow = (2e-4, 100e6 / 8)
    choices, c, measured, _, _ = auto_choices(cfg, links=slow, nodes=4, gpu=False)
    assert measured is None and c.workers == 8 and c.efficiency == 1.0 and c.latency_s == 2e-4
    assert c.bw == pytest.approx(100e6 / 8) and c.shared_cores == 4 * cores()
    ps = [ch for ch in choices if ch.strategy.startswith("ps-")]
    assert ps and {ch.prediction.workers for ch in ps} == {6}  # 2 of the 8 ranks serve
    assert {ch.prediction.workers for ch in choices if ch not in ps} == {8}
    assert choices[0].strategy == "ring-topk"
    gpu_choices, gpu_c, _, _, _ = auto_choices(cfg, links=slow, nodes=4, gpu=True)
    assert gpu_c.shared_cores is None and not [ch for ch in gpu_choices if ch.strategy.startswith("ps-")]
    fast, plan = _choose(cfg, (5e-5, 100e9 / 8), 4, True)
    assert plan["links"]["bandwidth_bytes_s"] == 100e9 / 8 and plan["cluster"]["workers"] == 8
    assert fast.strategy.strategy == plan["chosen"].split(" ")[0] and fast.run.workers == 8
    # every exchange hides: the strategies whose update is DDP's tie, and the plainest, DDP's all-reduce, wins
    assert plan["chosen"] == "allreduce" and "resolution" in plan["reasons"]


def torchrun(tmp_path, *flags, procs: int = 2):
    env = {k: v for k, v in os.environ.items() if k != "RINGPS_LAUNCHED"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
                           "-m", "ringps", "train", "--strategy", "auto", "--steps", "4", "--no-progress",
                           "--timeout", "60", *flags], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.slow
def test_torchrun_ranks_train_the_one_strategy_rank_0_chose(tmp_path):
    """Two ranks under torchrun: rank 0 times the job's step, both measure the links, both train
    the pick (the run's config is it, not "auto"), and the plan is in the run folder."""
    out = tmp_path / "auto"
    r = torchrun(tmp_path, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    plan = json.loads((out / "auto-plan.json").read_text())
    picked = plan["chosen"].split(" ")[0]
    assert (out / "config.yaml").read_text().count(f"strategy: {picked}") == 1
    s = json.loads((out / "summary.json").read_text())
    assert s["launcher"] == "torchrun" and s["steps"] == 4 and s["workers"] == 2
    assert plan["measured_step"]["steps"] == 6 and plan["links"]["bandwidth_bytes_s"] > 0
    assert plan["cluster"]["workers"] == 2 and plan["cluster"]["latency_s"] == plan["links"]["latency_s"]
    assert f"--strategy auto chose {plan['chosen']}" in " ".join(r.stderr.split())


@pytest.mark.slow
def test_rank_0s_failure_to_choose_reaches_every_rank_in_one_line(tmp_path):
    r = torchrun(tmp_path, "--auto-calibration", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "x"))
    assert r.returncode != 0
    lines = [l for l in r.stderr.splitlines() if l.startswith("ringps: ")]
    assert any(l.startswith("ringps: rank 0: --auto-calibration") and "no such file" in l for l in lines), r.stderr[-2000:]
    assert any(l.startswith("ringps: rank 1: rank 0 could not choose for --strategy auto: --auto-calibration")
               for l in lines), r.stderr[-2000:]
    assert not (tmp_path / "x").exists()  # nothing trained, no run folder
