"""The emulated cluster: shaped links that deliver their rate, a real two-node torchrun across
namespaces, and nothing left behind after a normal, a failed or an interrupted run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringps.launch import cluster as cl

pytestmark = [pytest.mark.slow, pytest.mark.net]
needs_root = pytest.mark.skipif(cl.requirements_missing() is not None, reason=str(cl.requirements_missing()))
TINY = ["--dataset", "synthetic", "--synthetic-samples", "512", "--synthetic-shape", "1,16,16", "--model", "mlp",
        "--batch-size", "16", "--timeout", "30"]


def ringps_namespaces() -> set[str]:
    return {n for n in cl.list_namespaces() if n.startswith(cl.PREFIX)}


def worker_pids() -> set[str]:
    return set(subprocess.run(["pgrep", "-f", "ringps.launch.worker"], capture_output=True, text=True).stdout.split())


@pytest.fixture
def no_leftovers():
    before, pids = ringps_namespaces(), worker_pids()
    yield
    time.sleep(0.3)
    # only what appeared during the test: another job's namespaces may come and go meanwhile
    assert ringps_namespaces() - before == set(), "namespaces left behind"
    assert worker_pids() - pids == set(), "processes left behind"


@needs_root
@pytest.mark.parametrize("rate", [100e6, 1e9])
def test_shaped_all_reduce_delivers_the_rate(rate, no_leftovers):
    from ringps.bench.net import bench_net

    res = bench_net([rate] * 3, seconds=0.6, iters=3)
    assert abs(res.busbw_bps / rate - 1) <= 0.15, res
    for link in res.links:
        assert abs(link.tcp_bps / rate - 1) <= 0.15, link
    # and it really is shaped: nowhere near loopback speed
    assert res.busbw_bps < 1.2 * rate


@needs_root
def test_unequal_links_are_shaped_each(no_leftovers):
    with cl.Cluster.create([1e9, 100e6]) as c:
        from ringps.bench.net import tcp_link

        fast_to_slow = tcp_link(c, 0, 1, 0.5)  # limited by host 1's receive side
        assert 0.8e8 < fast_to_slow < 1.15e8
        assert len(ringps_namespaces()) >= 3


def _wait_for_steps(run_dir: Path, rank: int, steps: int, timeout: float = 120) -> int:
    f = run_dir / "ranks" / f"rank{rank}.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if f.is_file():
            rows = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
            if sum(r["kind"] == "step" for r in rows) >= steps:
                return next(r["pid"] for r in rows if r["kind"] == "start")
        time.sleep(0.2)
    pytest.fail(f"rank {rank} did not reach step {steps}")


@needs_root
def test_net_run_reports_shaping_and_cleans_up(tmp_path, no_leftovers):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "ringps", "train", *TINY, "--workers", "2", "--epochs", "1",
                        "--net", "1gbit", "--out", str(out), "--no-progress"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["net"] == "1gbit" and "tc tbf" in s["placement"]
    assert all(h["tx_bytes"] > 0 for h in s["host_bytes"])
    assert "1gbit" in r.stdout


@needs_root
def test_killed_worker_leaves_nothing(tmp_path, no_leftovers):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "ringps", "train", *TINY, "--workers", "3", "--epochs", "500",
                          "--net", "1gbit", "--out", str(out), "--no-progress"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    pid = _wait_for_steps(out, 2, 3)
    os.kill(pid, signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "rank 2: killed by signal SIGKILL" in err


@needs_root
def test_sigint_to_the_launcher_leaves_nothing(tmp_path, no_leftovers):
    out = tmp_path / "run"
    # a shell that runs the suite in the background starts it with SIGINT ignored (POSIX), which
    # the launcher would inherit: give it the default disposition, as an interactive user's has
    p = subprocess.Popen([sys.executable, "-m", "ringps", "train", *TINY, "--workers", "2", "--epochs", "500",
                          "--net", "100mbit", "--out", str(out), "--no-progress"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_steps(out, 0, 2)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.terminate()  # the launcher cleans up on SIGTERM; leave nothing for the next test
        p.communicate(timeout=60)
        raise
    assert p.returncode == 130, err
    assert "interrupted" in err


@needs_root
def test_torchrun_two_nodes_across_emulated_hosts(tmp_path, no_leftovers):
    """The README's multi-machine path over a real network stack: one torchrun node per host."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    out = tmp_path / "two-nodes"
    with cl.Cluster.create([1e9, 1e9]) as c:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
        env.pop("RINGPS_LAUNCHED", None)
        procs = []
        for node in (0, 1):
            cmd = c.exec_prefix(node) + [
                torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                "--master-addr", c.addr(0), "--master-port", "29511", "-m", "ringps", "train", *TINY,
                "--steps", "6", "--out", str(out), "--no-progress",
            ]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=240)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), logs[0][-3000:] + logs[1][-3000:]
        counters = c.counters()
    s = json.loads((out / "summary.json").read_text())
    assert s["workers"] == 4 and s["steps"] == 6 and s["launcher"] == "torchrun"
    assert sorted(s["per_worker"]) == ["0", "1", "2", "3"]
    # gradients really crossed the link between the two hosts
    assert counters[1]["tx_bytes"] > 6 * 4 * 100_000


@needs_root
def test_torchrun_auto_chooses_on_the_links_it_measured(tmp_path, no_leftovers):
    """`--strategy auto` across two hosts joined by 100 Mbit/s: the ranks measure the link they
    really have (within its rate) and choose for it what 4 local workers at 100 Mbit/s measured
    fastest (a sparse exchange, RESULTS §1), not DDP; both train it."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    out = tmp_path / "auto"
    with cl.Cluster.create([100e6, 100e6]) as c:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
        env.pop("RINGPS_LAUNCHED", None)
        procs = [subprocess.Popen(c.exec_prefix(node) + [
            torchrun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr", c.addr(0),
            "--master-port", "29513", "-m", "ringps", "train", "--strategy", "auto", "--steps", "4", "--out", str(out),
            "--no-progress"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
        logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs[0][-3000:] + logs[1][-3000:]
    plan = json.loads((out / "auto-plan.json").read_text())
    assert 0.7 * 100e6 / 8 < plan["links"]["bandwidth_bytes_s"] < 1.05 * 100e6 / 8
    picked = plan["chosen"].split(" ")[0]
    assert picked in ("ring-topk", "topk-allgather", "powersgd"), plan["ranking"][:4]
    s = json.loads((out / "summary.json").read_text())
    assert s["workers"] == 2 and s["steps"] == 4 and f"strategy: {picked}" in (out / "config.yaml").read_text()


@needs_root
def test_layered_worker_replays_factor_layers_with_the_servers_momentum(tmp_path, no_leftovers):
    """A slow link makes the planner send the large layer as sufficient factors, which the worker
    replays: with one worker, its copy after the last step equals the server's values bit for
    bit, which it cannot if it replays with another momentum than the server's (--async-momentum)."""
    import torch

    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "ringps", "train", *TINY, "--strategy", "ps-async", "--layer-strategy",
                        "auto", "--workers", "1", "--steps", "6", "--checkpoint-every", "6", "--ps-checkpoint-every", "6",
                        "--async-momentum", "0.5", "--net", "10mbit", "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    plan = json.loads((out / "plan.json").read_text())["auto"]["layers"]
    assert "sf" in [layer["method"] for layer in plan], plan
    assert json.loads((out / "summary.json").read_text())["server_momentum"] == 0.5
    model = torch.load(out / "checkpoints" / "step6" / "rank0.pt", weights_only=False)["model"]
    server = torch.load(out / "checkpoints" / "server0" / "latest.pt", weights_only=False)
    assert server["version"] == 6
    mine = torch.cat([t.flatten() for t in model.values()])
    assert torch.equal(mine.sort().values, server["values"].sort().values)  # the same values, in shard order or not


def test_net_without_root_or_iproute2_is_one_line(tmp_path):
    """Without `ip` on PATH (or without root) --net fails at once, naming what is missing."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    r = subprocess.run([sys.executable, "-m", "ringps", "train", *TINY, "--net", "1gbit", "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "--net needs" in r.stderr and ("iproute2" in r.stderr or "root" in r.stderr)
    assert not (tmp_path / "x").exists()


def test_rate_count_must_match_hosts():
    r = subprocess.run([sys.executable, "-m", "ringps", "train", *TINY, "--workers", "4", "--net", "1gbit,100mbit"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "2 rates for 4 hosts" in r.stderr or "--net needs" in r.stderr
