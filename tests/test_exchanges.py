"""Every exchange equals the dense sum of the same sparse inputs, on real gloo ranks, and every
rank ends with the same bits. Random and overlapping indices, k=0, k=n, n not divisible by N,
N = 2, 3, 4."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from conftest import run_ranks

from ringps.comm.exchanges import EXCHANGES, Segment
from ringps.comm.meter import PayloadMeter
from ringps.comm.p2p import Ring
from ringps.comm.ring import ring_allreduce
from ringps.compress.selectors import Selection, Selector

pytestmark = pytest.mark.slow


class Given(Selector):
    """Selects exactly the nonzero entries it is given (the test's sparse input)."""

    def select(self, acc, k, step=0, key=0):
        idx = torch.nonzero(acc, as_tuple=True)[0]
        return Selection(idx, acc[idx])


def sparse_input(rank: int, n: int, k: int, overlap: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + (0 if overlap else rank))
    idx = torch.randperm(n, generator=g)[:k]
    if overlap and k < n:  # half the positions shared by all ranks, half each rank's own
        own = torch.randperm(n, generator=torch.Generator().manual_seed(rank))[: k // 2]
        idx = torch.unique(torch.cat([idx[: k - k // 2], own]))
    x = torch.zeros(n)
    x[idx] = torch.randn(idx.numel(), generator=torch.Generator().manual_seed(rank)) + 3.0  # never zero
    return x


CASES = [(1000, 50, True), (1000, 50, False), (997, 0, False), (997, 997, False), (10, 3, True)]
NAMES = ["allgather", "sparse-rs", "gloo-allgather", "dense", "dense-fp16"]


def exchange_cases(rank, world):
    """Every exchange on every case, in one process group (spawning is the slow part)."""
    out = {}
    ring = Ring(None, 60.0, PayloadMeter())
    for name in NAMES:
        for n, k, overlap in CASES:
            x = sparse_input(rank, n, k, overlap)
            nnz = int((x != 0).sum())
            got = EXCHANGES.build(name).reduce(x.clone(), [Segment(0, n, nnz, 0)], Given(), ring, step=0)
            ref = x.clone()
            dist.all_reduce(ref)
            out[(name, n, k, overlap)] = (got.update, ref / world, got.sent, x)
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_exchange_equals_dense_sum(world):
    res = run_ranks(exchange_cases, world)
    for case in res[0]:
        for per_rank in res:
            upd, ref, sent, x = per_rank[case]
            # dense-fp16: each value rounded to 16 bits once, each partial sum on the ring too
            tol = dict(rtol=2e-3, atol=2e-3) if case[0] == "dense-fp16" else dict(atol=1e-6)
            assert torch.allclose(upd, ref, **tol), case
            if sent is not None:
                assert torch.equal(sent, torch.nonzero(x, as_tuple=True)[0]), case
            assert torch.equal(upd, res[0][case][0]), f"replicas differ: {case}"
    assert any(not torch.equal(res[0][c][0], res[0][c][1]) for c in res[0] if c[0] == "dense-fp16")  # it did round


SHARED = [(1000, 64, 16), (1001, 100, 7), (50, 0, 4), (64, 64, 8)]


def shared_index_cases(rank, world):
    from ringps.comm.exchanges import SharedIndex

    out = {}
    for n, k, block in SHARED:
        acc = torch.randn(n, generator=torch.Generator().manual_seed(rank * 100 + n))
        got = SharedIndex(block).reduce(acc.clone(), [Segment(0, n, k, 0)], Given(), Ring(None, 60.0), step=0)
        out[(n, k, block)] = (got, acc)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_shared_index_sums_the_globally_largest_blocks(world):
    res = run_ranks(shared_index_cases, world)
    for (n, k, block) in SHARED:
        check_shared(world, n, k, block, [r[(n, k, block)] for r in res])


def check_shared(world, n, k, block, res):
    accs = torch.stack([a for _, a in res])
    nb = -(-n // block)
    padded = torch.zeros(world, nb * block)
    padded[:, :n] = accs
    scores = padded.view(world, nb, block).pow(2).sum(2).sum(0)
    kb = min(nb, -(-k // block))
    top = torch.topk(scores, kb).indices.sort().values if kb else torch.empty(0, dtype=torch.long)
    idx = (top.unsqueeze(1) * block + torch.arange(block)).flatten()
    idx = idx[idx < n]
    expected = torch.zeros(n)
    expected[idx] = accs.sum(0)[idx] / world
    for out, _ in res:
        assert torch.allclose(out.update, expected, atol=1e-5)
        assert torch.equal(out.sent, idx)
        assert torch.equal(out.update, res[0][0].update)


def two_steps(rank, world):
    from ringps.comm.exchanges import SharedIndex

    n, block = 1001, 7
    ex = SharedIndex(block)
    accs = [torch.randn(n, generator=torch.Generator().manual_seed(rank * 10 + t)) for t in range(2)]
    segs = [Segment(0, 700, 40, 0), Segment(700, 301, 20, 1)]
    outs = [ex.reduce(a.clone(), segs, Given(), Ring(None, 60.0), step=t) for t, a in enumerate(accs)]
    return outs, accs


def block_scores(x: torch.Tensor, block: int) -> torch.Tensor:
    nb = -(-x.numel() // block)
    padded = torch.zeros(nb * block)
    padded[: x.numel()] = x
    return padded.view(nb, block).pow(2).sum(1)


def test_shared_index_picks_the_next_blocks_from_the_residual_scores():
    """Step 2's blocks are the top blocks of the summed scores of what step 1 left behind (the
    scores ride with step 1's values), per segment; its values are step 2's, averaged."""
    res = run_ranks(two_steps, 3)
    segs, block = [(0, 700, 40), (700, 301, 20)], 7
    first = res[0][0][0].sent
    residual_scores = []
    for off, numel, k in segs:
        per_rank = []
        for _, accs in res:
            r = accs[0].clone()
            r[first] = 0
            per_rank.append(block_scores(r[off : off + numel], block))
        residual_scores.append(sum(per_rank))
    expected_idx = []
    for (off, numel, k), sc in zip(segs, residual_scores):
        top = torch.topk(sc, -(-k // block)).indices.sort().values
        pos = (top.unsqueeze(1) * block + torch.arange(block)).flatten()
        expected_idx.append(pos[pos < numel] + off)
    idx = torch.cat(expected_idx)
    mean2 = sum(accs[1] for _, accs in res) / 3
    for outs, _ in res:
        assert torch.equal(outs[1].sent, idx)
        assert torch.allclose(outs[1].update[idx], mean2[idx], atol=1e-5)
        assert int((outs[1].update != 0).sum()) == idx.numel()
        assert torch.equal(outs[1].update, res[0][0][1].update)


def randomk_case(rank, world):
    from ringps.comm.exchanges import SharedIndex
    from ringps.compress.selectors import RandomK

    acc = torch.randn(500, generator=torch.Generator().manual_seed(rank))
    out = SharedIndex(16).reduce(acc.clone(), [Segment(0, 500, 40, 0)], RandomK(seed=3), Ring(None, 60.0), step=5)
    total = acc.clone()
    dist.all_reduce(total)
    return out, total / world


def test_shared_index_with_randomk_uses_the_common_positions():
    res = run_ranks(randomk_case, 3)
    sent = res[0][0].sent
    assert 30 <= sent.numel() <= 40
    for out, ref in res:
        assert torch.equal(out.sent, sent)
        assert torch.allclose(out.update[sent], ref[sent], atol=1e-6)
        mask = torch.ones(500, dtype=torch.bool)
        mask[sent] = False
        assert torch.all(out.update[mask] == 0)


def dense_ring_cases(rank, world):
    out = {}
    for n in (1, 7, 1000, 4099):
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        meter = PayloadMeter()
        mine = ring_allreduce(x.clone(), Ring(None, 60.0, meter))
        ref = x.clone()
        dist.all_reduce(ref)
        out[n] = (mine, ref, meter.sent.get("dense-ring", 0))
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_dense_ring_matches_all_reduce(world):
    res = run_ranks(dense_ring_cases, world)
    for n in res[0]:
        for r in res:
            mine, ref, _ = r[n]
            assert torch.allclose(mine, ref, atol=1e-5)
            assert torch.equal(mine, res[0][n][0])  # bitwise identical on every rank
        if n >= world:
            assert abs(res[0][n][2] - 2 * (world - 1) / world * n * 4) <= 2 * world * 4
