"""ring-topk on real gloo ranks: bitwise identical replicas, error feedback that loses nothing,
density 1.0 == plain DDP, k = 0, and the public hook in a user's own DDP loop."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn
from conftest import run_ranks
from helpers import batches, config, context
from torch.nn.parallel import DistributedDataParallel as DDP

from ringps.comm.exchanges import progress_of
from ringps.hooks import RingTopkState, ring_topk_hook
from ringps.models import build_model
from ringps.strategies import STRATEGIES
from ringps.train.trainer import build_optimizer

pytestmark = pytest.mark.slow
EXCHANGES = ["allgather", "shared-index", "sparse-rs", "gloo-allgather", "auto"]


def train(rank, world, steps):
    out = {}
    for exchange in EXCHANGES:
        cfg = config(workers=world, strategy="ring-topk", lr=0.05, density=0.05, exchange=exchange,
                     dense_below=64, bucket_cap_mb=0.02, block=8, density_warmup_epochs=0,
                     exact_tail=0)  # the exchange asked for on every step (the tail: test_selection.py)
        torch.manual_seed(0)
        model = build_model("mlp", (1, 8, 8), 4)
        s = STRATEGIES.build("ring-topk", cfg)
        ctx = context(rank, world, cfg)
        ctx.sample_batch = batches(1, 16)[0]
        s.setup(model, build_optimizer(model.parameters(), cfg), ctx)
        losses = [s.step(b).loss for b in batches(steps, 16, seed=10 + rank)]
        s.close()
        out[exchange] = (torch.cat([p.detach().flatten() for p in model.parameters()]), losses,
                         dict(s.hook_state.chosen), s.summary()["decisions"])
    return out


def test_replicas_bitwise_identical_and_training_works():
    res = run_ranks(train, 3, (25,))
    for exchange in EXCHANGES:
        flat0, losses, chosen, decisions = res[0][exchange]
        for r in res[1:]:
            assert torch.equal(r[exchange][0], flat0), exchange
            assert r[exchange][3] == decisions  # one plan on every rank
        assert sum(losses[-5:]) < 0.8 * sum(losses[:5]), (exchange, losses)
        if exchange != "auto":
            assert set(chosen) == {exchange} and decisions == []
    # auto's record in the run folder: every bucket's pick is the cheapest per unit of progress
    decisions = res[0]["auto"][3]
    assert decisions and {d["chosen"] for d in decisions} <= set(res[0]["auto"][2])
    for d in decisions:
        assert d["entries"] == sum(d["sizes"]) and 0 < d["k"] < d["entries"] and d["overlap_s"] >= 0
        per_progress = {c: (d["compute_share_s"] + t) / progress_of(c) for c, t in d["priced_s"].items()}
        assert per_progress[d["chosen"]] == pytest.approx(min(per_progress.values()), abs=1e-5), d


class Linear(nn.Module):
    """loss = sum(w * x): the gradient is exactly x, whatever w is."""

    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return (self.w * x).sum()


def conservation(rank, world, exchange, density):
    n, steps = 5000, 6
    model = Linear(n)
    ddp = DDP(model)
    state = RingTopkState(density=density, exchange=exchange, dense_below=0, block=10).bind(model)
    ddp.register_comm_hook(state, ring_topk_hook)
    sent_sum, grad_sum = torch.zeros(n), torch.zeros(n)
    for t in range(steps):
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank * 100 + t))
        model.zero_grad()
        ddp(x).backward()
        grad_sum += x
        sent_sum += model.w.grad
    residual = state.memory.buffers["w"]["residual"].clone()
    state.close()
    return grad_sum, sent_sum, residual


@pytest.mark.parametrize("exchange", ["allgather", "shared-index", "sparse-rs"])
def test_error_feedback_loses_no_gradient_mass(exchange):
    """sum over workers and steps of the gradients == N x the applied updates + the residuals."""
    res = run_ranks(conservation, 3, (exchange, 0.02))
    grads = sum(g for g, _, _ in res)
    applied = res[0][1]
    residuals = sum(r for _, _, r in res)
    assert torch.allclose(grads, 3 * applied + residuals, atol=1e-4)
    assert residuals.abs().sum() > 0  # something really was held back


def test_density_zero_sends_nothing_and_remembers_everything():
    res = run_ranks(conservation, 2, ("allgather", 0.0))
    for grad_sum, applied, residual in res:
        assert torch.all(applied == 0)
        assert torch.allclose(residual, grad_sum, atol=1e-5)


def density_one(rank, world, exchange):
    torch.manual_seed(0)
    a, b = build_model("mlp", (1, 8, 8), 4), build_model("mlp", (1, 8, 8), 4)
    b.load_state_dict(a.state_dict())
    plain, hooked = DDP(a, bucket_cap_mb=0.02), DDP(b, bucket_cap_mb=0.02)
    state = RingTopkState(density=1.0, exchange=exchange, dense_below=0).bind(b)
    hooked.register_comm_hook(state, ring_topk_hook)
    diffs = []
    for batch in batches(3, 8, seed=rank):
        for m, net in ((a, plain), (b, hooked)):
            m.zero_grad()
            nn.functional.cross_entropy(net(batch.inputs), batch.targets).backward()
        diffs.append(max((p.grad - q.grad).abs().max().item() for p, q in zip(a.parameters(), b.parameters())))
    state.close()
    return max(diffs)


@pytest.mark.parametrize("exchange", ["allgather", "shared-index", "sparse-rs", "dense"])
def test_density_one_reproduces_ddp(exchange):
    assert max(run_ranks(density_one, 3, (exchange,))) < 1e-6


def dense_fp16_against_ddp(rank, world):
    """Five SGD steps at momentum 0.9: DDP in fp32, DDP with PyTorch's fp16 compression hook, and
    DDP with ring-topk forced to dense-fp16 (density and memory then play no part)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

    torch.manual_seed(0)
    models = [build_model("mlp", (1, 8, 8), 4) for _ in range(3)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    start = [p.detach().clone() for p in models[0].parameters()]
    fp32, fp16, hooked = (DDP(m, bucket_cap_mb=0.02) for m in models)
    fp16.register_comm_hook(None, fp16_compress_hook)
    state = RingTopkState(density=0.01, exchange="dense-fp16", dense_below=0).bind(hooked)  # no tensor deferred
    hooked.register_comm_hook(state, ring_topk_hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    for batch in batches(5, 8, seed=rank):
        for net, opt in zip((fp32, fp16, hooked), opts):
            opt.zero_grad()
            nn.functional.cross_entropy(net(batch.inputs), batch.targets).backward()
            opt.step()
    state.close()

    def diff(a, b):
        return max((p - q).abs().max().item() for p, q in zip(a, b))

    params = [list(m.parameters()) for m in models]
    return (diff(params[1], params[2]), diff(params[0], params[2]), diff(params[0], start), dict(state.chosen),
            state.meter.sent.get("dense", 0))


def test_a_failed_all_reduce_fails_the_bucket_future():
    """A dense bucket's all-reduce runs on after the hook returns: its failure (a peer gone, a
    timeout) must reach DDP's future for the bucket, which backward() then raises."""
    from ringps.hooks.ring_topk import _complete

    inflight, fut, buf = torch.futures.Future(), torch.futures.Future(), torch.zeros(3)
    _complete(fut, buf, inflight)
    assert not fut.done()
    inflight.set_exception(RuntimeError("rank 1: connection closed"))
    with pytest.raises(RuntimeError, match="rank 1"):
        fut.wait()
    ok, fut2 = torch.futures.Future(), torch.futures.Future()
    _complete(fut2, buf, ok)
    ok.set_result(None)
    assert fut2.wait() is buf


def test_dense_fp16_is_ddps_fp16_hook():
    """dense-fp16 is what a user of DDP's fp16 hook runs: after 5 steps at momentum 0.9 the model is
    DDP fp16's bitwise (not fp32 DDP's), in half fp32's bytes."""
    for to_fp16, to_fp32, moved, chosen, sent in run_ranks(dense_fp16_against_ddp, 2):
        assert moved > 1e-2 and to_fp16 == 0.0 and to_fp32 > 1e-6
        assert set(chosen) == {"dense-fp16"}
        n = sum(p.numel() for p in build_model("mlp", (1, 8, 8), 4).parameters())
        assert sent == 5 * n * 2  # a 2-rank ring sends each value once, 2 bytes each


class SleepInBackward(torch.autograd.Function):
    """The identity forward; its backward sleeps: a layer whose gradient takes `seconds`."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.seconds)
        return g, None


class Stages(nn.Module):
    """first -> (rank 0 sleeps) -> middle -> (rank 1 sleeps) -> last: rank 1's middle gradient is
    late, so rank 0's all-reduce of it waits, beside rank 0's own long backward of the input side."""

    def __init__(self, rank):
        super().__init__()
        self.first, self.middle, self.last = nn.Linear(8, 64), nn.Linear(64, 64), nn.Linear(64, 4)
        self.sleeps = (0.6, 0.0) if rank == 0 else (0.0, 0.3)

    def forward(self, x):
        x = SleepInBackward.apply(self.first(x), self.sleeps[0])
        x = SleepInBackward.apply(self.middle(x), self.sleeps[1])
        return self.last(x)


def measured_compute(rank, world):
    torch.manual_seed(0)
    model = Stages(rank)
    ddp = DDP(model, bucket_cap_mb=0.001)  # a bucket per tensor
    state = RingTopkState(exchange="auto", dense_below=256).bind(model)
    ddp.register_comm_hook(state, ring_topk_hook)
    for _ in range(RingTopkState.MEASURED_STEPS + 2):
        model.zero_grad()
        ddp(torch.randn(4, 8)).sum().backward()
    state.close()
    return state.compute_s


def test_auto_measures_the_compute_the_collectives_ran_beside():
    """With no compute given, auto measures the step's compute over its first steps, every rank's,
    and plans with the slowest's. Rank 0's backward holds 0.6 s of sleep after its middle layer's
    gradient is out, and that all-reduce waits 0.3 s for rank 1's: the step's compute is at least
    0.6 s. The hook's own time (0.3 s of it beside rank 0's backward) is not compute to subtract."""
    for compute_s in run_ranks(measured_compute, 2):
        assert compute_s >= 0.6
