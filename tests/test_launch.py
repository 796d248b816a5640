"""The whole job through the CLI: run folder contents, a killed worker, compare and report."""

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

pytestmark = pytest.mark.slow

TINY = ["--dataset", "synthetic", "--synthetic-samples", "256", "--synthetic-shape", "1,8,8", "--model", "mlp",
        "--batch-size", "16", "--no-progress", "--timeout", "30"]


def ringps(*args: str, timeout: float = 240, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringps", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_train_writes_a_complete_run_folder(tmp_path):
    out = tmp_path / "run"
    r = ringps("train", *TINY, "--workers", "2", "--epochs", "3", "--out", str(out), "--slowdown", "1,2")
    assert r.returncode == 0, r.stderr
    assert {"config.yaml", "metrics.jsonl", "summary.json", "ranks", "logs"} <= {p.name for p in out.iterdir()}
    assert not (out / "logs" / "rendezvous.store").exists()  # the file store goes with the ranks
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert len(steps) == 2 * 3 * 8  # 2 workers x 3 epochs x (256 / (2 x 16)) steps
    for key in ("worker", "step", "t", "loss", "compute_s", "comm_s", "wait_s", "bytes_sent", "bytes_recv", "cpu_s"):
        assert all(key in s for s in steps), key
    # every step really moved bytes over TCP (gloo all-reduce of the mlp's gradients), and took CPU
    assert all(s["bytes_sent"] > 0 and s["bytes_recv"] > 0 and s["cpu_s"] > 0 for s in steps)
    summary = json.loads((out / "summary.json").read_text())
    for key in ("strategy", "workers", "wall_s", "time_to_accuracy_s", "final_accuracy", "utilization",
                "bytes_sent_per_step", "slowdown"):
        assert key in summary, key
    assert summary["slowdown"] == [1.0, 2.0] and summary["workers"] == 2
    assert summary["cpu_s_per_step"] == pytest.approx(sum(s["cpu_s"] for s in steps) / len(steps))
    kernel = [s["host_kernel_cpu_s"] for s in steps if s["worker"] == 0]
    assert all(k >= 0 for k in kernel) and summary["host_kernel_cpu_s_per_step"] == pytest.approx(sum(kernel) / len(kernel))
    assert summary["final_accuracy"] > 0.5
    # worker 0 is twice as fast, so it waits for worker 1 at every exchange
    pw = summary["per_worker"]
    assert pw["0"]["wait_s"] > pw["1"]["wait_s"]
    assert "slowdown: 1,2" in r.stdout


def test_killed_worker_ends_the_job_naming_it(tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "ringps", "train", *TINY, "--workers", "3", "--epochs", "1000",
                          "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = out / "ranks" / "rank1.jsonl"
    deadline = time.monotonic() + 90
    pid = None
    while time.monotonic() < deadline and pid is None:
        if victim.is_file():
            for line in victim.read_text().splitlines():
                row = json.loads(line)
                if row["kind"] == "step" and row["step"] >= 3:
                    pid = next(json.loads(l)["pid"] for l in victim.read_text().splitlines() if '"start"' in l)
                    break
        time.sleep(0.2)
    assert pid is not None, "the job never got going"
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    _, err = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 30
    assert p.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("ringps: rank 1: killed by signal SIGKILL"), err
    # nothing left running
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", f"--run-dir {out}"], capture_output=True, text=True).stdout
    assert left.strip() == ""


def test_compare_and_report(tmp_path):
    out = tmp_path / "cmp"
    r = ringps("compare", "--strategies", "allreduce,fp16", *TINY, "--workers", "2", "--epochs", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    table = [l for l in r.stdout.splitlines() if l.startswith("│")]
    assert len(table) == 2 and "allreduce" in table[0] and "fp16" in table[1]
    assert "x)" in table[1]  # ratios to the first strategy
    assert all((out / n).is_file() for n in ("accuracy.png", "loss.png", "breakdown.png"))
    r = ringps("report", str(out / "allreduce"), str(out / "fp16"), "--plots", str(tmp_path / "plots"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plots" / "accuracy.png").stat().st_size > 1000
    # fp16 halves the gradient bytes on the wire
    s = [json.loads((out / n / "summary.json").read_text()) for n in ("allreduce", "fp16")]
    assert 0.4 < s[1]["bytes_sent_per_step"] / s[0]["bytes_sent_per_step"] < 0.65


def test_existing_run_folder_is_not_overwritten(tmp_path):
    (tmp_path / "run" / "ranks").mkdir(parents=True)
    r = ringps("train", *TINY, "--out", str(tmp_path / "run"))
    assert r.returncode == 2 and "already holds a run" in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_a_local_run_listens_on_loopback_only(tmp_path):
    """A local job rendezvous through a file store in its run folder (a TCP store listens on every
    interface) and keeps gloo on loopback: no socket of the job listens beyond 127.0.0.1. The job is
    long enough to be looked at, then interrupted (the launcher's SIGINT path removes the store too)."""
    import re

    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "ringps", "train", "--dataset", "synthetic", "--synthetic-samples", "4096",
                          "--synthetic-shape", "1,8,8", "--model", "mlp", "--epochs", "500", "--workers", "2",
                          "--no-progress", "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as an interactive user's
    try:
        pids: set[int] = set()
        deadline = time.monotonic() + 90
        while len(pids) < 2 and time.monotonic() < deadline:
            for f in (out / "ranks").glob("rank*.jsonl") if (out / "ranks").is_dir() else []:
                pids |= {r["pid"] for r in map(json.loads, f.read_text().splitlines()) if r.get("kind") == "start"}
            time.sleep(0.2)
        assert len(pids) == 2, "the job never started"
        listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
        ours = [l for l in listening if any(f"pid={pid}," in l for pid in pids)]
        assert ours, listening  # gloo's pair sockets
        for line in ours:
            local = line.split()[3]
            assert re.match(r"^(127\.0\.0\.1|\[::1\]):\d+$", local), line
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert not (out / "logs" / "rendezvous.store").exists()
