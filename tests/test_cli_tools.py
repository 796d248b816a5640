"""The measuring commands end to end: ringps plan, bench comm, bench ps, and option checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import cli_here

pytestmark = pytest.mark.slow


def ringps(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringps", *args], capture_output=True, text=True, timeout=timeout)


def test_plan_prints_every_layer_with_methods_and_predictions():
    r = ringps("plan", "--model", "facenet", "--workers", "4", "--net", "100mbit")
    assert r.returncode == 0, r.stderr
    rows = [l for l in r.stdout.splitlines() if l.startswith("│")]
    assert len(rows) == 6  # three conv and three fc layers
    assert all("dense" in l for l in rows[:3]) and any(" sf " in l or "topk" in l for l in rows[3:5])
    assert "predicted step, auto" in r.stdout and "predicted step, off" in r.stdout
    bad = ringps("plan", "--model", "facenet", "--density", "3")  # `ringps train`'s bounds, one line
    assert bad.returncode == 2 and bad.stderr.strip() == "ringps: --density 3.0: must be <= 1.0"


def test_bench_comm_reports_every_exchange():
    r = ringps("bench", "comm", "--workers", "2", "--sizes", "1e5", "--densities", "0.01", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    for name in ("gloo all_reduce", "dense ring", "allgather", "shared-index", "sparse-rs", "gloo-allgather"):
        assert name in r.stdout
    assert r.stdout.count(" * ") + r.stdout.count(" *│") >= 1  # the cost model's pick is marked


def test_bench_ps_counts_pushes():
    r = ringps("bench", "ps", "--params", "1e5", "--workers", "2", "--seconds", "2")
    assert r.returncode == 0, r.stderr
    row = next(l for l in r.stdout.splitlines() if l.startswith("│ loopback"))
    assert float(row.split("│")[2]) > 10  # server pushes per second


@pytest.mark.parametrize("args, message", [
    (["--strategy", "ps-sync", "--optimizer", "adam"], "the parameter servers run momentum SGD (ps-sync)"),
    (["--strategy", "ps-threshold", "--layer-strategy", "auto", "--optimizer", "adam"], "use --optimizer sgd"),
    (["--strategy", "ps-vsgd", "--vsgd-weight", "cubic:1"], "unknown weight function 'cubic'"),
])
def test_option_combinations_are_checked_before_anything_starts(capsys, args, message, tmp_path):
    code, err = cli_here(capsys, "train", *args, "--out", str(tmp_path / "run"))
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
