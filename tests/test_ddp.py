"""The DDP baselines on real gloo ranks: identical replicas, training that works, PowerSGD made
safe on several buckets without changing what it computes."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from conftest import run_ranks
from helpers import batches, config, context

from ringps.models import build_model
from ringps.strategies import STRATEGIES
from ringps.train.trainer import build_optimizer

pytestmark = pytest.mark.slow


def train_steps(rank, world, strategy, steps, extra):
    cfg = config(workers=world, strategy=strategy, lr=0.05, **extra)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 4)
    opt = build_optimizer(model.parameters(), cfg)
    s = STRATEGIES.build(strategy, cfg)
    s.setup(model, opt, context(rank, world, cfg))
    data = batches(steps, 16, seed=100 + rank)  # each rank its own data
    losses = [s.step(b).loss for b in data]
    s.close()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return losses, flat


@pytest.mark.parametrize("strategy", ["allreduce", "fp16", "powersgd"])
def test_replicas_identical_and_loss_goes_down(strategy):
    # tiny buckets: several per step, the case where the stock PowerSGD hook crashes gloo
    extra = {"bucket_cap_mb": 0.05, "powersgd_start_iter": 3, "powersgd_rank": 2}
    res = run_ranks(train_steps, 3, (strategy, 30, extra))
    for _, flat in res[1:]:
        assert torch.equal(flat, res[0][1])
    for losses, _ in res:
        assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5


def reference_step(rank, world):
    """allreduce strategy == averaging the gradients by hand, then the same SGD step."""
    cfg = config(workers=world, strategy="allreduce", lr=0.1, momentum=0.0, weight_decay=0.0)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 4)
    ref = build_model("mlp", (1, 8, 8), 4)
    ref.load_state_dict(model.state_dict())
    s = STRATEGIES.build("allreduce", cfg)
    s.setup(model, build_optimizer(model.parameters(), cfg), context(rank, world, cfg))
    b = batches(1, 8, seed=rank)[0]
    s.step(b)
    torch.nn.functional.cross_entropy(ref(b.inputs), b.targets).backward()
    for p in ref.parameters():
        dist.all_reduce(p.grad)
        p.data -= 0.1 * p.grad / world
    s.close()
    return max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref.parameters()))


def test_allreduce_equals_hand_averaged_sgd():
    assert max(run_ranks(reference_step, 2)) < 1e-6


def powersgd_direct(rank, world, ordered):
    """The same PowerSGD hook with and without OrderedHook, one bucket: identical gradients."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ringps.hooks import OrderedHook

    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 4)
    ddp = DDP(model, bucket_cap_mb=100)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    hook = OrderedHook(psgd.powerSGD_hook) if ordered else psgd.powerSGD_hook
    ddp.register_comm_hook(state, hook)
    grads = []
    for b in batches(4, 8, seed=rank):
        model.zero_grad()
        torch.nn.functional.cross_entropy(ddp(b.inputs), b.targets).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(grads)


def test_ordered_hook_does_not_change_powersgd():
    plain = run_ranks(powersgd_direct, 2, (False,))
    ordered = run_ranks(powersgd_direct, 2, (True,))
    assert torch.allclose(plain[0], ordered[0], atol=1e-6)
