"""Gradient selection, exact: the density warm-up, the sampled threshold's k, selection over many
steps, shared-index's pick of a block that dominates every step, and DGC's momentum correction
tensor by tensor against a reference written from DGC's own code (dgc/compression.py, memory.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import run_ranks
from torch.nn.parallel import DistributedDataParallel as DDP

from ringps.compress import DensitySchedule
from ringps.compress.memory import ErrorFeedback
from ringps.compress.selectors import SampledThreshold, TopK


def test_density_warmup_follows_dgc_and_reaches_the_final_density():
    s = DensitySchedule(0.001, warmup_steps=400)
    assert s(0) == 0.25 and s(400) == s(10_000) == 0.001
    # DGC's 0.25 -> 0.0625 -> 0.015 -> 0.004 -> 0.001, as a smooth curve through its stages
    assert [round(s(q), 4) for q in (100, 200, 300)] == [0.0629, 0.0158, 0.004]
    ds = [s(t) for t in range(401)]
    assert all(a > b for a, b in zip(ds, ds[1:]))
    assert s.k(10, 399) == 1 and s.k(1000, 0) == 250 and DensitySchedule(0.0).k(1000, 5) == 0
    assert DensitySchedule(0.5, warmup_steps=10)(0) == 0.5  # never starts sparser than the target


@pytest.mark.parametrize("n, density", [(200_000, 0.001), (200_000, 0.01), (1_000_000, 0.001)])
@pytest.mark.parametrize("dist", ["normal", "heavy"])
def test_sampled_threshold_selects_about_k_and_only_the_largest(n, density, dist):
    g = torch.Generator().manual_seed(n + int(1e4 * density))
    x = torch.randn(n, generator=g)
    if dist == "heavy":
        x = x.pow(3) * torch.rand(n, generator=g)
    k = int(n * density)
    sel = SampledThreshold(seed=1).select(x, k)
    assert 0.8 * k <= sel.indices.numel() <= 1.25 * k
    assert torch.equal(sel.values, x[sel.indices]) and torch.all(sel.indices[1:] > sel.indices[:-1])
    unsent = torch.ones(n, dtype=torch.bool)
    unsent[sel.indices] = False
    assert sel.values.abs().min() >= x[unsent].abs().max()  # everything sent outranks everything kept


@pytest.mark.parametrize("selector", [TopK(), SampledThreshold(seed=3)])
def test_selection_over_steps_sends_the_largest_accumulated_entries(selector):
    """Error feedback over 12 steps: each step sends the largest entries of residual + gradient
    (exactly the top k for TopK), keeps the rest, and loses nothing."""
    n, k = 50_000, 200
    mem, total, sent_total = ErrorFeedback(), torch.zeros(n), torch.zeros(n)
    scale = torch.rand(n, generator=torch.Generator().manual_seed(0)) ** 4  # some entries matter more
    for t in range(12):
        g = scale * torch.randn(n, generator=torch.Generator().manual_seed(t + 1))
        total += g
        acc = mem.compensate("w", g)
        before = acc.clone()
        sel = selector.select(acc, k)
        if isinstance(selector, TopK):
            assert set(sel.indices.tolist()) == set(torch.topk(before.abs(), k).indices.tolist())
        rest = torch.ones(n, dtype=torch.bool)
        rest[sel.indices] = False
        assert before[sel.indices].abs().min() >= before[rest].abs().max()
        sent_total[sel.indices] += sel.values
        mem.update("w", sel.indices)
        assert torch.equal(mem.buffers["w"]["residual"][rest], before[rest])
    assert torch.allclose(sent_total + mem.buffers["w"]["residual"], total, atol=1e-5)


class Two(nn.Module):
    """loss = sum(w * x) + sum(b * y): the gradients are exactly x and y."""

    def __init__(self, n: int, m: int):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.zeros(n)), nn.Parameter(torch.zeros(m))

    def forward(self, x, y):
        return (self.w * x).sum() + (self.b * y).sum()


def hook_updates(rank, world, exchange, memory, steps, n, m, density, block, inputs):
    """The update the hook hands DDP's optimizer for w and b, step by step."""
    from ringps.hooks import RingTopkState, ring_topk_hook

    model = Two(n, m)
    ddp = DDP(model)
    state = RingTopkState(density=density, exchange=exchange, memory=memory, dense_below=m + 1, block=block,
                          selector="topk", momentum=0.9).bind(model)
    ddp.register_comm_hook(state, ring_topk_hook)
    out = []
    for t in range(steps):
        x, y = inputs(rank, t)
        model.zero_grad()
        ddp(x, y).backward()
        out.append((model.w.grad.clone(), model.b.grad.clone()))
    state.close()
    return out


def dominant_inputs(rank, t):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(100 * rank + t))
    x[:10] *= 100  # block 0 carries 100x the others' gradient, every step
    return x, torch.zeros(4)


@pytest.mark.slow
def test_shared_index_sends_a_dominant_block_every_step():
    res = run_ranks(hook_updates, 2, ("shared-index", "ef", 8, 1000, 4, 0.01, 10, dominant_inputs))
    for rank_updates in res:
        sent_blocks = [sorted({int(i) // 10 for i in torch.nonzero(w).flatten()}) for w, _ in rank_updates]
        assert all(0 in blocks for blocks in sent_blocks[1:]), sent_blocks  # the first step agrees on scores


def random_inputs(rank, t):
    g = torch.Generator().manual_seed(1000 * rank + t)
    return torch.randn(3000, generator=g), torch.randn(8, generator=g)


def dgc_reference(world, exchange, steps, density, mu=0.9):
    """DGC's own semantics per tensor: w compressed (unless the exchange is dense): u = mu u + g,
    v += u, send the top k of v, mask u and v there, average the sends; b never compressed:
    m = mu m + mean(g), the update is m."""
    n = 3000
    k = int(density * n)
    u = [torch.zeros(n) for _ in range(world)]
    v = [torch.zeros(n) for _ in range(world)]
    mw, mb = torch.zeros(n), torch.zeros(8)
    out = []
    for t in range(steps):
        xs, ys = zip(*(random_inputs(r, t) for r in range(world)))
        if exchange == "dense":
            mw = mu * mw + torch.stack(xs).mean(0)
            upd_w = mw.clone()
        else:
            upd_w = torch.zeros(n)
            for r in range(world):
                u[r] = mu * u[r] + xs[r]
                v[r] = v[r] + u[r]
                idx = torch.topk(v[r].abs(), k).indices
                upd_w[idx] += v[r][idx]
                u[r][idx] = 0
                v[r][idx] = 0
            upd_w /= world
        mb = mu * mb + torch.stack(ys).mean(0)
        out.append((upd_w, mb.clone()))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["allgather", "dense"])
def test_dgc_memory_matches_dgc_tensor_by_tensor(exchange):
    """Compressed tensors get momentum correction with masking; a tensor sent dense and a small
    tensor keep ordinary momentum on the averaged gradient (DGC never masks what it did not
    select)."""
    steps, density = 8, 0.01
    res = run_ranks(hook_updates, 2, (exchange, "dgc", steps, 3000, 8, density, 16, random_inputs))
    ref = dgc_reference(2, exchange, steps, density)
    for rank_updates in res:
        for t, ((w, b), (rw, rb)) in enumerate(zip(rank_updates, ref)):
            assert torch.allclose(w, rw, atol=1e-5), (exchange, t, (w - rw).abs().max())
            assert torch.allclose(b, rb, atol=1e-5), (exchange, t)


def constant_inputs(rank, t):
    return torch.ones(3000), torch.ones(8)


@pytest.mark.slow
def test_dgc_small_tensors_keep_their_momentum_under_a_constant_gradient():
    res = run_ranks(hook_updates, 2, ("allgather", "dgc", 10, 3000, 8, 0.01, 16, constant_inputs))
    for rank_updates in res:
        b = [float(bb[0]) for _, bb in rank_updates]
        assert b == pytest.approx([sum(0.9 ** i for i in range(t + 1)) for t in range(10)], rel=1e-5)
        assert b[-1] > 6.5  # on its way to 1 / (1 - 0.9) = 10; the masked reset kept it at 1.0


def sixteen_bit(rank, world, exchange, dtype):
    from ringps.hooks import RingTopkState, ring_topk_hook

    out = {}
    for vd in ("fp32", dtype):
        model = Two(3000, 8)
        ddp = DDP(model)
        state = RingTopkState(density=0.02, exchange=exchange, dense_below=9, block=16, value_dtype=vd).bind(model)
        ddp.register_comm_hook(state, ring_topk_hook)
        grads = []
        for t in range(5):
            x, y = random_inputs(rank, t)
            model.zero_grad()
            ddp(x, y).backward()
            grads.append(model.w.grad.clone())
        out[vd] = (grads, sum(state.meter.sent.values()))
        state.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["allgather", "shared-index", "dense"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_sixteen_bit_values_keep_replicas_identical_and_close(exchange, dtype):
    res = run_ranks(sixteen_bit, 3, (exchange, dtype))
    for t in range(5):
        ref = res[0][dtype][0][t]
        for r in res[1:]:
            assert torch.equal(r[dtype][0][t], ref), (exchange, dtype, t)  # every rank applies the same bits
        full = res[0]["fp32"][0][t]
        if t == 0:  # the same selection: the values differ by the rounding alone
            eps = 2 ** -8 if dtype == "bf16" else 2 ** -10  # twice each format's unit roundoff
            if exchange == "dense":  # summed in 16 bits, as DDP's fp16 hook: the cast and 2 additions round
                eps *= 3 / 2
            assert (ref - full).abs().max() <= eps * full.abs().max()
        # later the rounding left out of the residual may change a few picks
        assert (ref - full).norm() < 0.05 * full.norm()
    assert res[0][dtype][1] < 0.8 * res[0]["fp32"][1]  # fewer bytes on the wire


def lr_memory_updates(rank, world, units, memory):
    """w's update over three steps of a constant gradient [3, 2, 1], top-1, the lr 1.0, 0.5, 0.5."""
    from ringps.hooks import RingTopkState, ring_topk_hook

    model = Two(3, 1)
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    state = RingTopkState(density=0.34, exchange="allgather", memory=memory, dense_below=2, selector="topk",
                          memory_units=units).bind(model, opt)
    ddp.register_comm_hook(state, ring_topk_hook)
    out = []
    for lr in (1.0, 0.5, 0.5):
        opt.param_groups[0]["lr"] = lr
        model.zero_grad()
        ddp(torch.tensor([3.0, 2.0, 1.0]), torch.ones(1)).backward()
        out.append(model.w.grad.tolist())
    saved = state.state_dict()
    state.close()
    return out, saved["memory_lr"]


@pytest.mark.slow
@pytest.mark.parametrize("units, expected", [
    # update units (Mem-SGD): the residual [0, 2, 1] held at lr 1 counts double at lr 0.5:
    # [0, 4, 2] + [3, 2, 1] sends 6 (moves 3.0 = 1.0 x 2 + 0.5 x 2), then [3, 0, 3] + [3, 2, 1] sends 6
    ("update", [[3, 0, 0], [0, 6, 0], [6, 0, 0]]),
    # gradient units: [0, 2, 1] + [3, 2, 1] sends 4 (moves 2.0: the held-back 2 at half its lr)
    ("gradient", [[3, 0, 0], [0, 4, 0], [6, 0, 0]]),
])
def test_memory_in_update_units_applies_a_held_back_gradient_at_its_own_lr(units, expected):
    for updates, memory_lr in run_ranks(lr_memory_updates, 2, (units, "ef")):
        assert updates == expected
        assert memory_lr == ({"w": 0.5} if units == "update" else {})


@pytest.mark.slow
def test_dgc_memory_in_update_units_rescales_the_velocity_not_the_momentum():
    # u = 0.9 u + g, v += u: step 1 u = v = [3, 2, 1], sends 3 -> u = v = [0, 2, 1]; step 2 (lr 0.5):
    # v = 2 x [0, 2, 1] + u, u = [3, 3.8, 1.9] -> v = [3, 7.8, 3.9]: sends 7.8
    updates, _ = run_ranks(lr_memory_updates, 2, ("update", "dgc"))[0]
    assert updates[0] == [3, 0, 0] and updates[1][0] == 0 and updates[1][2] == 0
    assert updates[1][1] == pytest.approx(7.8)


def tail_case(rank, world, exchange, steps, tail_from_step):
    """Per step: the update the hook hands DDP, and what every rank's memory held before the step
    (gathered), for a run whose last steps are its exact tail."""
    import torch.distributed as dist

    from ringps.cost import CostParams
    from ringps.hooks import RingTopkState, ring_topk_hook

    n, m = 1000, 4
    model = Two(n, m)
    ddp = DDP(model)
    # a link slow enough that auto sends shared-index's one block of 50 (with its 20 block scores,
    # 280 bytes) before each rank's own 50 (400 bytes); the tail may not
    state = RingTopkState(density=0.05, exchange=exchange, dense_below=m + 1, block=50, selector="topk",
                          total_steps=steps, exact_tail=1 - tail_from_step / steps, compute_s=0.0,
                          cost=CostParams(bandwidth=1e3, latency=1e-3)).bind(model)
    ddp.register_comm_hook(state, ring_topk_hook)
    out = []
    for t in range(steps):
        held = state.memory.buffers["w"]["residual"].clone() if "w" in state.memory.buffers else torch.zeros(n)
        every = [torch.empty(n) for _ in range(world)]
        dist.all_gather(every, held)
        x = torch.randn(n, generator=torch.Generator().manual_seed(100 * rank + t)) * torch.linspace(0.1, 3, n)
        model.zero_grad()
        ddp(x, torch.zeros(m)).backward()
        out.append((model.w.grad.clone(), every))
    state.close()
    return out, dict(state.chosen)


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["shared-index", "auto", "gloo-allgather"])
def test_exact_tail_sends_every_ranks_own_top_k_for_the_last_steps(exchange):
    """From the tail's first step on, each rank sends the exact top k of its own accumulation
    (residual + gradient), summed and averaged, whatever shared-index did before; before it, the
    forced or cost-chosen shared-index's common blocks. A forced exchange as faithful as any
    (gloo-allgather, the top-k all-gather peer's) is kept to the end."""
    world, steps, tail_from, k = 2, 6, 3, 50
    res = run_ranks(tail_case, world, (exchange, steps, tail_from))
    updates, chosen = res[0]
    if exchange == "gloo-allgather":
        assert chosen == {"gloo-allgather": steps}
    else:
        assert chosen.get("shared-index") == tail_from and chosen.get("allgather", 0) + chosen.get("sparse-rs", 0) == 3, chosen
    for t in range(steps):
        accs = [updates[t][1][r] + torch.randn(1000, generator=torch.Generator().manual_seed(100 * r + t))
                * torch.linspace(0.1, 3, 1000) for r in range(world)]
        if t >= tail_from or exchange == "gloo-allgather":
            want = torch.zeros(1000)
            for a in accs:
                top = torch.topk(a.abs(), k).indices
                want[top] += a[top]
            assert torch.allclose(updates[t][0], want / world, atol=1e-5), t
        else:  # one common block of 50, the same positions for every rank
            sent = torch.nonzero(updates[t][0]).flatten()
            assert sent.numel() == k and sent[0] % 50 == 0 and torch.equal(sent, sent[0] + torch.arange(k))
            assert torch.allclose(updates[t][0][sent], sum(accs)[sent] / world, atol=1e-5), t
    for u, _ in res[1:]:
        assert all(torch.equal(a[0], b[0]) for a, b in zip(u, updates))  # every rank applies the same
