"""Local SGD (PyTorch's post-local SGD) and DiLoCo on real gloo ranks: DiLoCo's outer step against
a hand-computed two-worker case, and local SGD's replicas apart between averages, equal at them."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import run_ranks
from helpers import batches, config, context

from ringps.models import build_model
from ringps.strategies import STRATEGIES
from ringps.train.trainer import build_optimizer

pytestmark = pytest.mark.slow


def diloco_rounds(rank, world):
    cfg = config(workers=world, strategy="diloco", local_period=2, momentum=0.0, weight_decay=0.0, lr=0.1)
    model = nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    s = STRATEGIES.build("diloco", cfg)
    s.setup(model, build_optimizer(model.parameters(), cfg), context(rank, world, cfg))
    out = []
    for rnd in range(2):  # stand-in for two inner steps: each rank moves its model its own way
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p.sub_(0.2 * (rank + 1) * (rnd + 1) * (i + 1))
        s.sync()
        out.append([p.detach().clone() for p in model.parameters()])
    return out


def test_diloco_outer_step_is_nesterov_on_the_averaged_pseudo_gradient():
    res = run_ranks(diloco_rounds, 2)
    for i in range(2):  # parameter i: rank r moved it by 0.2 (r + 1) (round + 1) (i + 1)
        d1 = 0.2 * 1.5 * (i + 1)  # round 1: mean over ranks of 0.2 (r + 1) (i + 1)
        w1 = 1.0 - 0.7 * (d1 + 0.9 * d1)  # torch's Nesterov: buf = d; step = d + 0.9 buf
        d2 = 2 * d1
        buf = 0.9 * d1 + d2
        w2 = w1 - 0.7 * (d2 + 0.9 * buf)
        for r in range(2):
            assert torch.allclose(res[r][0][i], torch.full_like(res[r][0][i], w1), atol=1e-6)
            assert torch.allclose(res[r][1][i], torch.full_like(res[r][1][i], w2), atol=1e-6)


def localsgd_steps(rank, world):
    cfg = config(workers=world, strategy="localsgd", local_period=3, local_warmup_steps=2, lr=0.05)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 4)
    s = STRATEGIES.build("localsgd", cfg)
    ctx = context(rank, world, cfg)
    ctx.sample_batch = batches(1, 16)[0]
    s.setup(model, build_optimizer(model.parameters(), cfg), ctx)
    flats = []
    for b in batches(9, 16, seed=10 + rank):
        s.step(b)
        flats.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    s.close()
    return flats


def test_localsgd_replicas_drift_apart_between_averages_and_meet_at_them():
    res = run_ranks(localsgd_steps, 2)
    same = [torch.equal(a, b) for a, b in zip(*res)]
    # steps 1-2: global gradient all-reduce; then local steps, averaged after steps 3, 6, 9 (the
    # averager counts from 0 and averages at count >= warm-up, every period)
    assert same == [True, True, True, False, False, True, False, False, True], same
