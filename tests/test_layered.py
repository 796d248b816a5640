"""Layer-aware strategy: plan choices, sufficient factors == the FC gradient, balanced partition,
priority order on the wire, and a worker's copy that stays bit-identical to the server's."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import run_ranks
from helpers import config

from ringps.cost import CostParams
from ringps.models import build_model
from ringps.ps.layout import Layout
from ringps.schedule.plan import make_plan
from ringps.schedule.profile import LayerProfile, Profile, profile_model


def synthetic_profile(batch: int = 16) -> Profile:
    layers = [
        LayerProfile("conv1", "conv", 832, 832 * 4, 0.05, 0.10, (32, 1, 5, 5)),
        LayerProfile("conv2", "conv", 18_496, 18_496 * 4, 0.08, 0.16, (64, 32, 3, 3)),
        LayerProfile("fc1", "fc", 10_093_568, 10_093_568 * 4, 0.01, 0.02, (1024, 9856), 9856, 1024),
        LayerProfile("fc2", "fc", 8256, 8256 * 4, 0.001, 0.001, (64, 128), 128, 64),
    ]
    return Profile(layers, 0.15, 0.3, batch)


@pytest.mark.parametrize("rate", [100e6 / 8, 1e9 / 8])
def test_plan_compresses_the_heavy_fc_layer_and_keeps_convs_dense(rate):
    plan = make_plan(synthetic_profile(), workers=4, servers=1, worker_bps=rate, p=CostParams(bandwidth=rate))
    by = {l.name: l for l in plan.layers}
    assert by["conv1"].method == "dense" and by["conv2"].method == "dense"
    assert by["fc1"].method in ("sf", "topk")
    assert by["fc1"].up_bytes < 0.05 * by["fc1"].params * 4
    # fc2: batch * (in + out) = 3072 < in * out = 8192 would allow factors, but the layer is tiny
    assert [l.priority for l in plan.layers] == [0, 1, 2, 3]
    assert plan.predict()["step_s"] < make_plan(synthetic_profile(), 4, 1, rate, methods=("dense",)).predict()["step_s"]


def test_prediction_puts_the_factor_replay_on_the_next_forward_path():
    """Hand-computed: one sf layer after 0.13 s of conv forward, n = 4 updates of 0.1 s each."""
    prof = synthetic_profile()
    for l in prof.layers:
        l.update_s, l.rebuild_s = (0.05, 0.05) if l.name == "fc1" else (0.0, 0.0)
    rate = 1e8  # bytes/s
    plan = make_plan(prof, workers=4, servers=1, worker_bps=rate, p=CostParams(bandwidth=rate, latency=0.0))
    fc1 = next(l for l in plan.layers if l.name == "fc1")
    assert fc1.method == "sf" and fc1.replay_s == pytest.approx(0.4) and fc1.lock_s == pytest.approx(0.05)
    assert fc1.down_bytes == 4 * (16 * (9856 + 1024) * 4 + 1024 * 4)
    pr = plan.predict()
    # fc1's reply arrives after the convs' and its own bytes, is replayed (0.4 s), and the forward
    # of conv1 + conv2 (0.13 s) hides part of it; half of the other three workers' 0.05 s
    # updates are queued ahead of this worker's reply
    arrival = sum(l.down_bytes for l in plan.layers[:3]) / rate
    assert pr["exposed_s"] == pytest.approx(arrival + 0.4 - 0.13 + 1.5 * 0.05, abs=1e-3)
    assert pr["step_s"] == pytest.approx(pr["compute_s"] + pr["exposed_s"])


def test_factors_are_not_offered_when_they_are_larger_than_the_weight():
    plan = make_plan(synthetic_profile(batch=4096), workers=4, servers=1, worker_bps=1e7)
    assert next(l for l in plan.layers if l.name == "fc1").method != "sf"


@pytest.mark.parametrize("servers", [1, 2, 3, 4, 7])
def test_contiguous_shards_are_balanced(servers):
    model = build_model("facenet", (1, 112, 92), 40)
    layout = Layout.of(model, servers=servers)
    sizes = [layout.shard_numel(s) for s in range(servers)]
    assert sum(sizes) == layout.numel and max(sizes) <= 1.1 * min(sizes)
    assert sum(len(layout.pieces(s)) for s in range(servers)) >= len(layout.names)


def test_the_planner_places_whole_layers_and_balances_the_servers():
    prof = synthetic_profile()
    prof.layers.append(LayerProfile("fc3", "fc", 10_000_000, 40_000_000, 0.01, 0.02, (1000, 10000), 10000, 1000))
    plan = make_plan(prof, workers=4, servers=2, worker_bps=1e7, methods=("dense",))
    by = {l.name: l.server for l in plan.layers}
    assert by["fc1"] != by["fc3"]  # the two heavy layers on different servers
    one = make_plan(prof, workers=4, servers=1, worker_bps=1e7, methods=("dense",))
    assert plan.predict()["server_link_s"] < 0.6 * one.predict()["server_link_s"]
    # the layout follows the placement: each server's shard is its layers, local offsets line up
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2), nn.Linear(2, 2))
    layout = Layout.of(model, 2).placed({"0.weight": 1, "0.bias": 1, "1.weight": 0, "1.bias": 0, "2.weight": 1, "2.bias": 1})
    assert layout.ranges(1) == [(0, 15), (23, 29)] and layout.ranges(0) == [(15, 23)]
    assert layout.shard_numel(0) + layout.shard_numel(1) == layout.numel and layout.local(1, 23) == 15
    flat = torch.arange(29.0)
    from ringps.ps.layout import gather
    assert gather(flat, layout, 1).tolist() == list(range(15)) + list(range(23, 29))
    assert layout.fingerprint != Layout.of(model, 2).fingerprint


def test_sufficient_factors_reproduce_the_fc_gradient():
    from ringps.ps.layers import LayerSpec, sf_gradient

    torch.manual_seed(0)
    model = build_model("facenet", (1, 32, 32), 10)
    fc = model.classifier[1]
    cap = {}

    def fwd(m, a, out):
        cap["x"] = a[0].detach()
        out.register_hook(lambda g: cap.__setitem__("d", g.detach()))

    fc.register_forward_hook(fwd)
    x, y = torch.randn(8, 1, 32, 32), torch.randint(0, 10, (8,))
    F.cross_entropy(model(x), y).backward()
    spec = LayerSpec(0, "classifier.1", fc, 0, fc.weight.numel() + fc.bias.numel(), "sf", 0.01)
    factors = torch.cat([cap["d"].reshape(-1), cap["x"].reshape(-1), fc.bias.grad])
    g = sf_gradient(spec, factors, 8)
    assert torch.equal(g[: fc.weight.numel()].view_as(fc.weight), fc.weight.grad)
    assert torch.equal(g[fc.weight.numel() :], fc.bias.grad)


def layered_pair(rank, world, steps):
    """Rank 0 serves, rank 1 trains a small facenet with every method in the plan."""
    from ringps.ps import POLICIES
    from ringps.ps.layer_server import LayerServer
    from ringps.ps.layered import LayeredClient
    from ringps.ps.layers import layer_specs
    from ringps.ps.layout import flatten_into

    torch.manual_seed(0)
    model = build_model("facenet", (1, 32, 32), 10)
    layout = Layout.of(model, servers=1)
    x, y = torch.randn(8, 1, 32, 32), torch.randint(0, 10, (8,))
    prof = profile_model(model, x, y, reps=1)
    plan = make_plan(prof, workers=1, servers=1, worker_bps=1e6)
    methods = ["dense", "fp16", "dense", "sf", "topk", "dense"]  # one of each, whatever the costs
    for lp, m in zip(plan.layers, methods):
        lp.method = m
    specs = layer_specs(model, plan, layout, density=0.1)
    if rank == 0:
        init = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        server = LayerServer(0, 0, [1], layout, POLICIES.build("async", config()), init, 0.9, 5e-4,
                             timeout=30.0, specs=specs)
        arrivals = []
        orig = server._layer_payload
        server._layer_payload = lambda h: (arrivals.append(h.layer), orig(h))[1]
        server.serve()
        return server.shard.values.clone(), arrivals
    values, grads = flatten_into(model, layout)
    client = LayeredClient(1, (0,), model, specs, layout, values, grads, 30.0, 0.9, 5e-4)
    received = []
    orig = client._apply_reply
    client._apply_reply = lambda s, h, srv: (received.append(s.index), orig(s, h, srv))[1]
    client.refresh()
    for step in range(steps):
        client.begin_step(0.05, step + 1)
        grads.zero_()
        F.cross_entropy(model(x), y).backward()
    client.close()
    return values.clone(), received


def test_priority_order_on_the_wire_and_identical_copies():
    (server_values, arrivals), (worker_values, received) = run_ranks(layered_pair, 2, (4,))
    n = 6
    # pushes leave as each layer's backward finishes (last layer first) ...
    assert arrivals == list(range(n - 1, -1, -1)) * 4
    # ... and updates come back in the order the next forward needs them
    assert received == list(range(n)) * 5  # the first pull, then one answer per step
    # the factor replay and every other method leave the worker with the server's exact bits
    assert torch.equal(server_values, worker_values)
