"""Parameter-server policies on a real Server object, driven push by push: threshold's bound,
threshold(T large) == async, sync == the averaged SGD step, VSGD's weight, DC-ASGD's
compensation, the wire header's validation (none of these involve timing), and the evaluation
hold (a pushing thread must still be waiting after a short join)."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn as nn
from helpers import config

from ringps.ps import POLICIES, wire
from ringps.ps.layout import Layout
from ringps.ps.server import Server


def make_server(policy: str, workers=(1, 2, 3), momentum=0.9, wd=0.0, **ps):
    cfg = config(**ps)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 30), nn.Linear(30, 5))
    layout = Layout.of(model, servers=1)
    init = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    return Server(0, 0, list(workers), layout, POLICIES.build(policy, cfg), init, momentum, wd, timeout=10.0), layout


def push(server: Server, worker: int, version: int, grad: torch.Tensor, lr=0.1, sample=None):
    h = wire.Header(wire.OP_PUSHPULL, worker, 0, version=version, payload=grad.numel(), lr=lr)
    return server.push(worker, h, grad.clone(), sample)


def script(n: int, pushes: int = 40, seed: int = 0):
    """(worker, staleness-to-ask-for, gradient) triples: some fresh, some very stale."""
    g = torch.Generator().manual_seed(seed)
    return [(1 + i % 3, int(torch.randint(0, 8, (1,), generator=g)), torch.randn(n, generator=g)) for i in range(pushes)]


def replay(policy: str, steps, **ps) -> tuple[Server, list[tuple[int, int]]]:
    server, _ = make_server(policy, **ps)
    seen = []
    for worker, lag, grad in steps:
        version = max(0, server.shard.version - lag)
        status, *_ = push(server, worker, version, grad)
        seen.append((server.shard.version - version if status == wire.DROPPED else lag, status))
    return server, seen


def test_threshold_never_applies_a_push_staler_than_T():
    server, _ = make_server("threshold", staleness_threshold=2)
    steps = script(server.n)
    applied_staleness = []
    for worker, lag, grad in steps:
        version = max(0, server.shard.version - lag)
        staleness = server.shard.version - version
        status, *_ = push(server, worker, version, grad)
        if status == wire.APPLIED:
            applied_staleness.append(staleness)
        else:
            assert staleness > 2
    assert max(applied_staleness) <= 2 and server.max_applied_staleness <= 2
    assert server.dropped > 0 and server.applied == len(applied_staleness)


def test_threshold_default_follows_the_workers_and_ssp_keeps_its_bound():
    for workers, t in ((1, 0), (4, 6), (8, 14)):
        assert POLICIES.build("threshold", config(workers=workers)).threshold == t
        assert POLICIES.build("ssp", config(workers=workers)).threshold == 4
    assert POLICIES.build("threshold", config(workers=8, staleness_threshold=3)).threshold == 3
    assert make_server("threshold")[0].stats()["staleness_threshold"] == 6  # the config's 4 workers
    assert make_server("async")[0].stats()["staleness_threshold"] is None


ASYNC = ("async", "threshold", "ssp", "stale-lr", "dcasgd", "vsgd")


@pytest.mark.parametrize("workers, want", [(1, 0.9), (2, 0.8), (4, 0.6), (10, 0.0), (40, 0.0)])
def test_async_momentum_offsets_the_momentum_asynchrony_adds(workers, want):
    """(1 - server momentum) x (1 - asynchrony's 1 - 1/N) = 1 - 0.9, floored at 0; BSP keeps 0.9."""
    for name in ASYNC:
        assert POLICIES.build(name, config(workers=workers)).server_momentum == pytest.approx(want), name
    assert POLICIES.build("sync", config(workers=workers)).server_momentum == 0.9


def test_async_momentum_given_is_used_by_every_asynchronous_policy_and_not_by_sync():
    for name in ASYNC:
        assert POLICIES.build(name, config(workers=4, async_momentum=0.3)).server_momentum == 0.3
    assert POLICIES.build("sync", config(workers=4, async_momentum=0.3)).server_momentum == 0.9


def test_threshold_with_large_T_equals_async():
    steps = script(make_server("async")[0].n)
    a, _ = replay("async", steps)
    t, _ = replay("threshold", steps, staleness_threshold=10**6)
    assert torch.equal(a.shard.values, t.shard.values) and a.shard.version == t.shard.version == len(steps)
    assert t.dropped == 0


def test_stale_lr_divides_the_learning_rate():
    s, _ = make_server("stale-lr", momentum=0.0)
    ref = s.shard.values.clone()
    for _ in range(4):  # advance the version to 4
        push(s, 1, s.shard.version, torch.zeros(s.n))
    g = torch.randn(s.n)
    push(s, 2, 0, g, lr=0.3)  # staleness 4 -> lr 0.075, and a push is 1/3 of a step of 3 workers
    assert torch.allclose(s.shard.values, ref - 0.025 * g, atol=1e-6)


def test_sync_equals_the_averaged_sgd_step():
    """Three workers push concurrently; the result is torch.optim.SGD's step on their mean."""
    server, _ = make_server("sync", momentum=0.9, wd=1e-3)
    p = nn.Parameter(server.shard.values.clone())
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=1e-3)
    for round_ in range(3):
        grads = [torch.randn(server.n, generator=torch.Generator().manual_seed(10 * round_ + w)) for w in (1, 2, 3)]
        threads = [threading.Thread(target=push, args=(server, w, round_, g)) for w, g in zip((1, 2, 3), grads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        p.grad = torch.stack(grads).mean(0)
        opt.step()
        assert server.shard.version == round_ + 1
    assert torch.allclose(server.shard.values, p.detach(), atol=1e-6)
    assert server.applied == 9 and server.histogram[0] == 9


def test_vsgd_weight_is_one_at_zero_distance_and_falls():
    cfg = config(vsgd_weight="inverse:0.01")
    policy = POLICIES.build("vsgd", cfg)
    w = torch.randn(1000)
    pos = [torch.arange(0, 500, 7), torch.arange(500, 1000, 5)]
    pulled = torch.cat([w[p] for p in pos])
    d0 = policy.distances(w, pos, pulled)
    assert d0 == [0.0, 0.0] and policy.weights(d0) == [1.0, 1.0]
    last = [1.0, 1.0]
    for eps in (1e-4, 1e-3, 1e-2, 1e-1):
        moved = w + eps * torch.randn(1000, generator=torch.Generator().manual_seed(1))
        weights = policy.weights(policy.distances(moved, pos, pulled))
        assert all(a < b for a, b in zip(weights, last))
        last = weights
    for name in ("exp", "inverse", "linear"):
        f = POLICIES.build("vsgd", config(vsgd_weight=f"{name}:0.05"))
        ws = f.weights([0.0, 0.01, 0.02, 0.04])
        assert ws[0] == 1.0 and ws == sorted(ws, reverse=True)


def test_vsgd_distances_equal_a_per_tensor_norm():
    """The segment-sum distances against the definition, tensor by tensor; sizes that differ a
    lot (one position, a whole tensor) and a tensor the worker's values match exactly."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(5000, generator=g)
    pos = [torch.tensor([7]), torch.arange(100, 1100, 3), torch.arange(1100, 5000)]
    pulled = torch.cat([w[p] + 0.05 * torch.randn(p.numel(), generator=g) for p in pos])
    pulled[0] = w[7]  # the first tensor unchanged: distance 0
    got = POLICIES.build("vsgd", config()).distances(w, pos, pulled)
    want, start = [], 0
    for p in pos:
        was = pulled[start : start + p.numel()]
        start += p.numel()
        want.append(float(torch.linalg.vector_norm(w[p] - was) / torch.linalg.vector_norm(w[p])))
    assert got[0] == 0.0 and want[1] > 0.01
    assert got == pytest.approx(want, rel=1e-5)


def test_vsgd_relative_weight_keeps_typical_pushes_whole_and_weighs_down_far_ones():
    policy = POLICIES.build("vsgd", config(vsgd_weight="relative:2"))
    assert policy.judge_values([0.5, 0.5]).weights == (1.0, 1.0)  # nothing typical yet: whole steps
    for i in range(64):  # typical distances: 0.01 for the first tensor, 0.1 for the second
        policy.judge_values([0.01 * (1 + (i % 3 - 1) * 0.1), 0.1])
    assert policy.weights([0.0, 0.0]) == [1.0, 1.0]
    assert policy.weights([0.02, 0.2]) == [1.0, 1.0]  # up to K x the median: whole
    ws = policy.weights([0.04, 0.4])
    assert ws == pytest.approx([0.5, 0.5])  # beyond: K x median / d
    assert policy.weights([0.4, 4.0]) == pytest.approx([0.05, 0.05])
    verdict = policy.judge_values([0.04, 0.1])
    assert verdict.apply and verdict.weights == pytest.approx((0.5, 1.0)) and verdict.weight == pytest.approx(0.75)


def test_vsgd_push_scope_gives_every_tensor_the_median_weight():
    per_tensor = POLICIES.build("vsgd", config(vsgd_weight="linear:1.0"))
    per_push = POLICIES.build("vsgd", config(vsgd_weight="linear:1.0", vsgd_scope="push"))
    d = [0.1, 0.5, 0.2]
    assert per_tensor.judge_values(d).weights == pytest.approx((0.9, 0.5, 0.8))
    verdict = per_push.judge_values(d)
    assert verdict.weights == pytest.approx((0.8, 0.8, 0.8)) and verdict.weight == pytest.approx(0.8)
    assert per_push.judge_values([0.0, 0.0]).weights == (1.0, 1.0)


def test_vsgd_relative_history_survives_a_server_checkpoint(tmp_path):
    server, _ = make_server("vsgd", vsgd_weight="relative:2")
    server.out_dir = tmp_path
    pulled = fresh_sample(server)  # the initial values: every later push is further from them
    for i in range(10):
        push(server, 1 + i % 3, server.shard.version, torch.randn(server.n), sample=pulled)
    server.save_checkpoint()
    resumed, _ = make_server("vsgd", vsgd_weight="relative:2")
    assert resumed.load_checkpoint(tmp_path) and resumed.shard.version == 10
    assert [list(r) for r in resumed.policy.recent] == [list(r) for r in server.policy.recent]
    assert len(resumed.policy.recent) == len(server.pieces) and len(resumed.policy.recent[0]) == 10
    far = pulled + 1.0
    assert resumed.policy.weights(resumed.policy.distances(resumed.shard.values, resumed.sample_pos, far)) == \
        server.policy.weights(server.policy.distances(server.shard.values, server.sample_pos, far))


def test_vsgd_drops_beyond_the_drop_distance_and_weighs_each_tensor():
    server, layout = make_server("vsgd", vsgd_drop=0.5, vsgd_weight="linear:1.0", momentum=0.0)
    pos = server.sample_pos
    assert len(pos) == 4 and all(p.numel() >= min(64, piece.numel) for p, piece in zip(pos, server.pieces))
    fresh = fresh_sample(server)
    before = server.shard.values.clone()
    status, verdict, *_ = push(server, 1, 0, torch.ones(server.n), lr=3.0, sample=fresh)  # 3 workers: lr/3
    assert status == wire.APPLIED and verdict.weight == 1.0
    assert torch.allclose(server.shard.values, before - 1.0, atol=1e-6)
    far = fresh + 10.0  # values the server never had: distance far beyond 0.5
    status, verdict, *_ = push(server, 2, 0, torch.ones(server.n), sample=far)
    assert status == wire.DROPPED and server.dropped == 1


def test_dcasgd_compensates_with_the_values_sent_to_that_worker():
    server, _ = make_server("dcasgd", momentum=0.0, dcasgd_lambda=0.5)
    server.policy.sent(1, server.shard.values)  # what the server last sent worker 1
    push(server, 2, 0, torch.ones(server.n), lr=0.3)  # moves the values by -0.1 (lr / 3 workers)
    w_before = server.shard.values.clone()
    g = torch.full((server.n,), 2.0)
    push(server, 1, 0, g, lr=0.3)
    # g + 0.5 * g * g * (w_now - w_pulled) = 2 + 0.5 * 4 * (-0.1) = 1.8
    assert torch.allclose(server.shard.values, w_before - 0.1 * 1.8, atol=1e-5)


def test_dcasgd_adaptive_scales_lambda_by_the_running_mean_square():
    server, _ = make_server("dcasgd", momentum=0.0, dcasgd_lambda=0.5, dcasgd_adaptive=True)
    server.policy.sent(1, server.shard.values)  # what the server last sent worker 1
    push(server, 2, 0, torch.full((server.n,), 4.0), lr=0.3)  # v = 16; values move by -0.4
    w_before = server.shard.values.clone()
    push(server, 1, 0, torch.full((server.n,), 2.0), lr=0.3)
    # v = 0.95 * 16 + 0.05 * 4 = 15.4; g + 0.5 / sqrt(v) * g * g * (w_now - w_pulled) = 2 - 0.8 / sqrt(15.4)
    expected = 2 + 0.5 / 15.4 ** 0.5 * 4 * (-0.4)
    assert torch.allclose(server.shard.values, w_before - 0.1 * expected, atol=1e-5)
    assert torch.allclose(server.policy.state_dict()["mean_square"], torch.full((server.n,), 15.4))


def fresh_sample(server: Server):
    """The value sample of a worker whose values equal the server's (None: the policy needs none)."""
    return torch.cat([server.shard.values[p] for p in server.sample_pos]) if server.policy.needs_sample else None


def held_push(server: Server, worker: int) -> tuple[threading.Thread, list]:
    """Push from `worker` in a thread (as the server's handler thread would); the outcome lands in the list."""
    out: list = []

    def run():
        try:
            out.append(push(server, worker, server.shard.version, torch.ones(server.n), sample=fresh_sample(server)))
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("policy", ["async", "threshold", "vsgd", "sync"])
def test_a_push_waits_while_another_worker_evaluates(policy):
    server, _ = make_server(policy, workers=(1, 2), momentum=0.0)
    server.hold(1, wire.Header(wire.OP_PULL, 1, 0, flags=wire.FLAG_HOLD))
    t, out = held_push(server, 2)
    t.join(0.3)
    assert t.is_alive() and server.shard.version == 0 and server.applied == 0  # held before anything was judged
    server.hold(2, wire.Header(wire.OP_PULL, 2, 0, flags=wire.FLAG_RELEASE))  # only the holder can release
    t.join(0.3)
    assert t.is_alive()
    server.hold(1, wire.Header(wire.OP_PULL, 1, 0, flags=wire.FLAG_RELEASE))
    if policy == "sync":  # the round needs worker 1's push too
        push(server, 1, 0, torch.ones(server.n))
    t.join(5)
    assert not t.is_alive() and not isinstance(out[0], Exception), out
    assert out[0].status == wire.APPLIED and out[0].paused >= 0.3 and server.shard.version == 1
    # the holder's own push never waits for itself
    server.hold(1, wire.Header(wire.OP_PULL, 1, 0, flags=wire.FLAG_HOLD))
    if policy != "sync":
        assert push(server, 1, 1, torch.ones(server.n), sample=fresh_sample(server)).paused == 0.0


def test_a_dead_evaluator_releases_the_others_and_a_stuck_one_times_out():
    server, _ = make_server("async", workers=(1, 2), momentum=0.0)
    server.hold(1, wire.Header(wire.OP_PULL, 1, 0, flags=wire.FLAG_HOLD))
    t, out = held_push(server, 2)
    t.join(0.2)
    assert t.is_alive()
    with server.shard.cond:  # what `handle` does when worker 1's connection fails
        server.live.discard(1)
        server.shard.cond.notify_all()
    t.join(5)
    assert out and out[0].status == wire.APPLIED
    server, _ = make_server("async", workers=(1, 2), momentum=0.0)
    server.timeout = 0.2
    server.hold(1, wire.Header(wire.OP_PULL, 1, 0, flags=wire.FLAG_HOLD))
    t, out = held_push(server, 2)
    t.join(5)
    assert "worker rank 2's push waited 0.2s for worker rank 1 to finish evaluating" in str(out[0])
    assert server.shard.version == 0


def good_fields(layout: Layout, **kw) -> wire.Header:
    h = wire.Header(wire.OP_PUSHPULL, 1, 0, version=0, payload=layout.shard_numel(0), fingerprint=layout.fingerprint, lr=0.1)
    for k, v in kw.items():
        setattr(h, k, v)
    return h


@pytest.mark.parametrize("change, reason, drainable", [
    ({}, None, True),
    ({"fingerprint": 123}, "fingerprint", True),
    ({"payload": 10**9}, "at most", False),
    ({"payload": 7}, "exactly", True),
    ({"version": 5}, "version 5 outside", True),
    ({"lr": float("nan")}, "learning rate", True),
    ({"sender": 2}, "sender field", True),
    ({"op": 99}, "unknown op", False),
])
def test_header_validation(change, reason, drainable):
    server, layout = make_server("async")
    h = good_fields(layout, **change)
    exp = wire.Expect(1, 0, layout.fingerprint, layout.shard_numel(0), 0, 0)
    _, why, drain = wire.validate(h.encode(), exp)
    assert (why is None) == (reason is None) and (reason is None or reason in why)
    assert drain == drainable


def test_corrupted_header_fails_the_checksum():
    _, layout = make_server("async")
    raw = good_fields(layout).encode()
    raw[4] += 1  # flip the version without fixing the checksum
    exp = wire.Expect(1, 0, layout.fingerprint, layout.shard_numel(0), 0, 10)
    assert wire.validate(raw, exp)[1] == "header checksum mismatch"
    raw[0] = 42
    assert "bad magic" in wire.validate(raw, exp)[1]
