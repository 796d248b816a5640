"""Parameter servers with real processes: the wire refuses bad messages and changes nothing,
ps-sync == DDP, a dead worker (async carries on, sync stops), sample agreement, checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from conftest import run_ranks
from helpers import config

pytestmark = pytest.mark.slow
TINY = ["--dataset", "synthetic", "--synthetic-samples", "256", "--synthetic-shape", "1,8,8", "--model", "mlp",
        "--batch-size", "16", "--no-progress", "--timeout", "30"]


def ringps(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringps", *args], capture_output=True, text=True, timeout=timeout)


def rogue(rank, world):
    """Rank 0 serves; rank 1 sends good and bad messages and reads the answers."""
    from ringps.ps import POLICIES, wire
    from ringps.ps.layout import Layout
    from ringps.ps.server import Server

    torch.manual_seed(0)
    model = nn.Linear(10, 10)
    layout = Layout.of(model, servers=1)
    init = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    n = layout.shard_numel(0)
    if rank == 0:
        server = Server(0, 0, [1], layout, POLICIES.build("async", config()), init, 0.0, 0.0, timeout=20.0)
        server.serve()
        return server.shard.values, server.shard.version, server.refused, dict(server.failed), init

    def request(h: "wire.Header", payload=None) -> "wire.Header":
        dist.send(h.encode() if isinstance(h, wire.Header) else h, dst=0, tag=wire.TAG_HEADER)
        if payload is not None:
            dist.send(payload, dst=0, tag=wire.TAG_PAYLOAD)
        raw = wire.empty_header()
        dist.recv(raw, src=0, tag=wire.TAG_REPLY)
        reply = wire.Header.decode(raw)
        if reply.status in (wire.APPLIED, wire.DROPPED) or (reply.op == wire.OP_REPLY and reply.payload and reply.status == 0):
            values = torch.empty(n)
            dist.recv(values, src=0, tag=wire.TAG_VALUES)
        return reply

    fp = layout.fingerprint
    statuses = []
    good = dict(op=wire.OP_PUSHPULL, sender=1, shard=0, version=0, payload=n, fingerprint=fp, lr=0.1)
    statuses.append(request(wire.Header(**{**good, "fingerprint": fp + 1}), torch.ones(n)).status)  # drained
    statuses.append(request(wire.Header(**{**good, "lr": -1.0}), torch.ones(n)).status)  # drained
    statuses.append(request(wire.Header(**good), torch.ones(n)).status)  # applied: version 1
    bad = wire.Header(**good).encode()
    bad[5] = 10**12  # an oversized payload with a forged checksum: refused, and the peer is cut off
    bad[wire.FIELDS - 1] = wire.checksum(bad.tolist())
    statuses.append(request(bad).status)
    return statuses


def test_malformed_messages_are_refused_and_change_nothing():
    from ringps.ps import wire

    (values, version, refused, failed, init), statuses = run_ranks(rogue, 2)
    assert statuses == [wire.REFUSED, wire.REFUSED, wire.APPLIED, wire.REFUSED]
    assert version == 1 and refused == 3
    assert torch.allclose(values, init - 0.1)  # exactly the one good push, nothing of the bad ones
    assert "protocol violation" in failed[1]


def samples(rank, world):
    from ringps.models import build_model
    from ringps.ps.layout import Layout

    torch.manual_seed(rank)  # different global RNG state on each rank must not matter
    model = build_model("facenet", (1, 112, 92), 40)
    layout = Layout.of(model, servers=2)
    return [torch.cat(layout.sample_positions(s, 0.01)) for s in range(2)], layout.fingerprint


def test_server_and_worker_agree_on_vsgd_sample_coordinates():
    (a, fa), (b, fb) = run_ranks(samples, 2)
    assert fa == fb
    for x, y in zip(a, b):
        assert torch.equal(x, y) and x.numel() > 1000


def test_ps_sync_equals_ddp(tmp_path):
    common = [*TINY, "--workers", "2", "--steps", "6", "--checkpoint-every", "6", "--lr", "0.05"]
    for s in ("ps-sync", "allreduce"):
        r = ringps("train", *common, "--strategy", s, "--out", str(tmp_path / s))
        assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        a = torch.load(tmp_path / "ps-sync" / "checkpoints" / "step6" / f"rank{rank}.pt", weights_only=False)["model"]
        b = torch.load(tmp_path / "allreduce" / "checkpoints" / "step6" / f"rank{rank}.pt", weights_only=False)["model"]
        for k in b:
            assert torch.allclose(a[k], b[k], atol=1e-5), k
    s = json.loads((tmp_path / "ps-sync" / "summary.json").read_text())
    assert s["pushes_applied"] == 12 and s["max_applied_staleness"] == 0 and s["staleness_histogram"] == {"0": 12}
    assert s["server_momentum"] == 0.9  # BSP: DDP's momentum, no asynchrony to offset


def test_evaluation_holds_an_asynchronous_job_still(tmp_path):
    """Worker 0 evaluates after every step: no server applies or drops a push while it does, and
    the time other workers were held is reported and left out of their clocks."""
    out = tmp_path / "run"
    r = ringps("train", *TINY, "--synthetic-samples", "20000",  # a test split that takes ~30 ms to score
               "--strategy", "ps-async", "--workers", "3", "--steps", "60", "--eval-every", "1",
               "--slowdown", "1,2,3", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(e["began"], e["ended"]) for e in rows if e["kind"] == "eval"]
    pushes = [p["wall"] for p in rows if p["kind"] == "push"]
    assert len(evals) >= 10 and len(pushes) >= 90
    inside = [w for w in pushes if any(a < w < b for a, b in evals)]
    assert not inside, f"{len(inside)} pushes handled during an evaluation"
    s = json.loads((out / "summary.json").read_text())
    paused = [s["per_worker"][w]["paused_s"] for w in ("1", "2")]
    assert s["per_worker"]["0"]["paused_s"] == 0.0 and all(p > 0.0 for p in paused), paused
    assert s["server_momentum"] == pytest.approx(0.7)  # 3 workers: 1 - 3 x (1 - 0.9)


def _start(tmp_path: Path, strategy: str, workers: int = 3):
    out = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-m", "ringps", "train", *TINY, "--strategy", strategy, "--workers", str(workers),
                          "--epochs", "40", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    f = out / "ranks" / "rank2.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if f.is_file():
            rows = [json.loads(l) for l in f.read_text().splitlines() if l.strip()]
            if sum(r["kind"] == "step" for r in rows) >= 3:
                return p, out, next(r["pid"] for r in rows if r["kind"] == "start")
        time.sleep(0.2)
    p.kill()
    pytest.fail("the job never got going")


def test_killing_a_worker_in_ps_async_lets_the_job_finish(tmp_path):
    p, out, pid = _start(tmp_path, "ps-async")
    os.kill(pid, signal.SIGKILL)
    _, err = p.communicate(timeout=240)
    assert p.returncode == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert "2" in s["failed_workers"] and "killed by signal SIGKILL" in s["failed_workers"]["2"]
    # the two live workers did the dead one's share of the budget (40 epochs x 6 steps x 3 workers).
    # The dead worker's own count may lack its last step: SIGKILL can land after the server applied
    # its push and before the worker wrote the row, so its share is what the server applied.
    steps = {w: s["per_worker"][w]["steps"] for w in ("0", "1", "2")}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    applied_2 = sum(r["kind"] == "push" and r.get("worker") == 2 for r in rows)
    assert steps["2"] <= applied_2 <= steps["2"] + 1
    assert steps["0"] + steps["1"] + applied_2 >= 40 * 6 * 3
    assert steps["2"] < 40 * 6 < steps["0"]
    assert s["pushes_applied"] >= 40 * 6 * 3
    assert "carry on" in err


def test_killing_a_worker_in_ps_sync_stops_the_job(tmp_path):
    p, out, pid = _start(tmp_path, "ps-sync")
    os.kill(pid, signal.SIGKILL)
    _, err = p.communicate(timeout=240)
    assert p.returncode == 1
    assert "rank 2: killed by signal SIGKILL" in err.strip().splitlines()[-1]


def test_server_checkpoint_resumes_with_the_same_versions(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    r = ringps("train", *TINY, "--strategy", "ps-async", "--workers", "2", "--steps", "9", "--ps-checkpoint-every", "4",
               "--out", str(a))
    assert r.returncode == 0, r.stderr
    saved = torch.load(a / "checkpoints" / "server0" / "latest.pt", weights_only=False)
    assert saved["version"] == 16  # 18 pushes, a checkpoint every 4 versions
    r = ringps("train", *TINY, "--strategy", "ps-async", "--workers", "2", "--steps", "3", "--resume", str(a),
               "--out", str(b))
    assert r.returncode == 0, r.stderr
    pushes = [json.loads(l) for l in (b / "ranks" / "rank2.jsonl").read_text().splitlines() if '"push"' in l]
    # the first push lands on version 17; 6 pushes of budget, plus at most one already in flight
    assert min(p["version"] for p in pushes) == 17 and 22 <= max(p["version"] for p in pushes) <= 23


@pytest.mark.parametrize("strategy", [["ps-async"], ["ps-sync"], ["ps-vsgd", "--layer-strategy", "auto"]],
                         ids=["async", "sync", "vsgd-layers"])
def test_stop_at_target_ends_every_worker_of_a_parameter_server_job(tmp_path, strategy):
    """Only worker 0 evaluates a parameter-server job; at the target it tells the servers, and
    every worker stops after its step (a synchronous round is not waited out). It used to be
    ignored: the job ran its whole budget, 30 epochs here, past a target met at step 4."""
    out = tmp_path / "run"
    r = ringps("train", *TINY, "--strategy", *strategy, "--workers", "3", "--epochs", "30", "--eval-every", "4",
               "--target-accuracy", "0.01", "--stop-at-target", "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    per_epoch = next(r["steps_per_epoch"] for r in rows if r["kind"] == "start")
    assert s["time_to_accuracy_s"] is not None and s["final_accuracy"] >= 0.01
    evals = [r for r in rows if r["kind"] == "eval"]
    assert len(evals) == 1 and evals[0]["step"] == 4  # the first evaluation met the target: the last
    assert len([r for r in rows if r["kind"] == "end"]) == 3  # every worker ended
    # the others push at their own pace until then (one did 27 steps beside the evaluator's 4 on a busy
    # machine; 166 pushes were applied in all in one clean-clone run), so the count before the end is
    # the machine's; from the servers' finish on, a worker's push is its last (its reply says so),
    # and a layered worker's the one after it: that reply lands while its next step's forward runs
    finish = [r for r in rows if r["kind"] == "finish"]
    assert len(finish) == 1  # one server, told once
    after = Counter(r["worker"] for r in rows if r["kind"] == "push" and r["wall"] > finish[0]["wall"])
    assert all(n <= (2 if "--layer-strategy" in strategy else 1) for n in after.values()), after
    assert s["pushes_applied"] < 30 * per_epoch * 3 / 2  # the 30 epochs' budget was not run


def test_budget_counts_applied_updates_not_dropped_pushes(tmp_path):
    """ps-threshold with T = 0 drops most pushes of a 1:4 slower worker: the job still applies its
    whole budget (epochs x steps per epoch x workers), as ps-async does; it used to end early
    with the dropped pushes counted against it."""
    out = tmp_path / "run"
    # 32x32 inputs: compute (~4 ms a step) longer than the server's turn, so workers' pushes overlap
    # and T = 0 drops dozens; on 8x8 (under 1 ms) they could fall one after another, none stale
    big = [a if a != "1,8,8" else "1,32,32" for a in TINY]
    r = ringps("train", *big, "--strategy", "ps-threshold", "--staleness-threshold", "0", "--workers", "3",
               "--slowdown", "1,1,4", "--epochs", "3", "--out", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    per_epoch = next(r["steps_per_epoch"] for r in rows if r["kind"] == "start")
    budget = 3 * per_epoch * 3
    assert s["pushes_dropped"] > 3  # more than the pushes in flight at the end
    assert budget <= s["pushes_applied"] < budget + 3  # at most one push per worker in flight past it
