"""Trainer pieces: LR schedule, clock, the comm/wait split, spikes, checkpoint and resume."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ringps.train.summary import accuracy_setbacks, loss_spikes, split_wait
from ringps.train.trainer import Clock, lr_factor


def test_lr_schedule():
    assert lr_factor(0, 100, 10, "cosine") == pytest.approx(0.1)
    assert lr_factor(9, 100, 10, "cosine") == pytest.approx(1.0)
    assert lr_factor(10, 100, 10, "cosine") == pytest.approx(1.0)
    assert lr_factor(55, 100, 10, "cosine") == pytest.approx(0.5)
    assert lr_factor(99, 100, 0, "constant") == 1.0
    assert lr_factor(80, 100, 0, "step") == pytest.approx(0.01)


def test_clock_excludes_pauses():
    c = Clock()
    c.pause()
    frozen = c.now()
    import time

    time.sleep(0.05)
    assert c.now() == frozen
    c.resume()
    assert c.now() - frozen < 0.04


def test_wait_is_the_gap_to_the_last_worker():
    rows = [
        {"step": 1, "worker": 0, "t_ready": 10.0, "exposed_s": 2.5, "wait_s": None},
        {"step": 1, "worker": 1, "t_ready": 12.0, "exposed_s": 0.5, "wait_s": None},
    ]
    split_wait(rows, synchronous=True)
    assert rows[0]["wait_s"] == 2.0 and rows[0]["comm_s"] == 0.5
    assert rows[1]["wait_s"] == 0.0 and rows[1]["comm_s"] == 0.5


def test_loss_spikes():
    flat = [1.0] * 30
    assert loss_spikes(flat) == 0
    assert loss_spikes(flat[:25] + [2.0] + flat[:4]) == 1
    assert loss_spikes([0.01] * 25 + [0.03]) == 0  # tiny losses: below the absolute floor
    assert loss_spikes([1.0] * 25 + ["inf"]) == 1
    # near convergence: 0.1 -> 0.3 is 3x, but small against a starting loss of 3.7
    assert loss_spikes([3.7] * 20 + [0.1] * 25 + [0.3]) == 0
    assert loss_spikes([3.7] * 20 + [0.1] * 25 + [1.0]) == 1


def test_accuracy_setbacks():
    assert accuracy_setbacks([0.1, 0.3, 0.5, 0.9, 0.95]) == 0
    assert accuracy_setbacks([0.1, 0.29, 0.03, 0.02, 0.1, 0.3, 0.5]) == 1  # one collapse, recovered
    assert accuracy_setbacks([0.5, 0.3, 0.5, 0.3]) == 2  # fell, recovered, fell again
    assert accuracy_setbacks([0.9, 0.85, 0.88]) == 0  # within 10 points of the best


@pytest.mark.slow
@pytest.mark.parametrize("strategy,exchange,selector", [  # ring-topk's allgather with top-k: the other two's parts
    ("allreduce", "allgather", "auto"), ("ring-topk", "shared-index", "auto"),
    ("ring-topk", "allgather", "randomk"), ("localsgd", "dense", "auto"), ("diloco", "dense", "auto")])
def test_resume_continues_exactly(tmp_path, strategy, exchange, selector):
    """Checkpoint at step 4, resume into a new run: step 8 is bitwise what the unbroken run had
    (the ring-topk residuals, selector generator, shared-index's block scores and loop position
    are all in the checkpoint; randomk's positions are keyed by tensor name, not by DDP's bucket
    index, which changes when DDP rebuilds its buckets after the first step)."""
    common = ["--dataset", "synthetic", "--synthetic-samples", "128", "--synthetic-shape", "1,8,8", "--model",
              "facenet", "--batch-size", "8", "--workers", "2", "--steps", "8", "--no-progress", "--strategy", strategy,
              "--exchange", exchange, "--selector", selector, "--density", "0.05", "--dense-below", "1000",
              "--local-period", "3", "--local-warmup-steps", "2"]  # a checkpoint in the middle of a local round

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "ringps", "train", *common, *args], capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr

    run("--checkpoint-every", "4", "--out", str(tmp_path / "a"))
    run("--checkpoint-every", "4", "--out", str(tmp_path / "b"), "--resume", str(tmp_path / "a" / "checkpoints" / "step4"))
    for rank in (0, 1):
        a = torch.load(tmp_path / "a" / "checkpoints" / "step8" / f"rank{rank}.pt", weights_only=False)
        b = torch.load(tmp_path / "b" / "checkpoints" / "step8" / f"rank{rank}.pt", weights_only=False)
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), k
        assert b["step"] == 8
