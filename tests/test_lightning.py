"""The Lightning integration: the hook really registered on CPU, density 1.0 bitwise Lightning's
plain DDP, and a resume from a Lightning checkpoint (rank 0's file) that continues bitwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")
pytestmark = pytest.mark.slow
JOB = Path(__file__).with_name("lightning_job.py")


def run(out: Path, kind: str, resume: str | None = None) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([sys.executable, str(JOB), str(out), kind, *([resume] if resume else [])], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return [torch.load(out / f"final-rank{rank}.pt", weights_only=False) for rank in (0, 1)]


def test_density_one_is_bitwise_plain_ddp(tmp_path):
    plain, ring = run(tmp_path / "plain", "plain"), run(tmp_path / "ring", "ring-dense")
    for a, b in zip(plain, ring):
        assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
    assert ring[0]["hook_steps"] == 6 and ring[0]["chosen"] == {"dense": 6}  # registered: it ran every step


def test_resume_from_a_lightning_checkpoint_continues_bitwise(tmp_path):
    whole = run(tmp_path / "whole", "ring")
    assert whole[0]["chosen"] == {"allgather": 6}
    ckpt = sorted((tmp_path / "whole").glob("epoch=0*.ckpt"))[0]
    assert "ringps_ring_topk" in torch.load(ckpt, weights_only=False)  # every rank's residuals, in rank 0's file
    resumed = run(tmp_path / "resumed", "ring", str(ckpt))
    for a, b in zip(whole, resumed):
        assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))


def test_the_exact_tail_takes_the_runs_length_from_the_trainer(tmp_path):
    """exact_tail=0.5 without total_steps: the strategy reads Lightning's estimated_stepping_batches
    (6: 2 epochs of 3), so the last 3 steps of a forced shared-index go by allgather."""
    tail = run(tmp_path / "tail", "ring-tail")
    assert tail[0]["chosen"] == {"shared-index": 3, "allgather": 3}
    assert all(torch.equal(x, y) for x, y in zip(tail[0]["params"], tail[1]["params"]))  # replicas agree
