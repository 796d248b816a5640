"""The parameter server's arithmetic, exact, at the settings users run (momentum 0.9, several
workers, concurrent pushes). Each test is named for a defect it catches:

- test_stale_lr_*_momentum*: stale-lr must scale the gradient before momentum, not the step;
- test_reply_version_*: a reply's version must be the version of the values that follow it;
- test_layered_whole_step_*: a worker step is applied whole or dropped whole, on every layer and
  every server;
- SSP's bound, factor replay with several workers and scaled updates, the log-limit refresh.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from conftest import run_ranks
from helpers import config

from ringps.ps import POLICIES, wire
from ringps.ps.layout import Layout
from ringps.ps.server import BUFFERS, Server


def make_server(policy: str, workers=(1, 2, 3), momentum=0.9, **ps) -> Server:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 30), nn.Linear(30, 5))
    layout = Layout.of(model, servers=1)
    init = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    return Server(0, 0, list(workers), layout, POLICIES.build(policy, config(**ps)), init, momentum, 0.0, timeout=10.0)


def push(server: Server, worker: int, version: int, grad: torch.Tensor, lr=0.3):
    h = wire.Header(wire.OP_PUSHPULL, worker, 0, version=version, payload=grad.numel(), lr=lr)
    return server.push(worker, h, grad.clone(), None)


def test_stale_lr_scales_the_gradient_before_momentum():
    """Hand-computed, momentum 0.9: a push 4 versions stale enters the momentum buffer as g/4,
    so it moves the model a quarter as far in total (10 lr g -> 2.5 lr g), not 7.5% less."""
    s = make_server("stale-lr")
    start = s.shard.values.clone()
    for _ in range(4):  # four fresh zero pushes: version 4, nothing moves
        push(s, 1, s.shard.version, torch.zeros(s.n))
    g = torch.randn(s.n, generator=torch.Generator().manual_seed(1))
    push(s, 2, 0, g)  # staleness 4; lr 0.3 / 3 workers = 0.1
    assert torch.allclose(s.shard.momentum, g / 4, atol=1e-7)
    for _ in range(3):  # momentum carries a quarter of g on
        push(s, 1, s.shard.version, torch.zeros(s.n))
    moved = start - s.shard.values
    assert torch.allclose(moved, 0.1 * g / 4 * (1 + 0.9 + 0.81 + 0.729), atol=1e-6)
    # the summary's weights: seven pushes at 1, one at 1/4
    st = s.stats()
    assert (st["mean_weight"], st["min_weight"], st["pushes_weighted"]) == (7.25 / 8, 0.25, 1)
    # and a fresh push of the same gradient goes in whole
    f = make_server("stale-lr")
    push(f, 2, 0, g)
    assert torch.allclose(f.shard.momentum, g, atol=1e-7)
    assert (f.stats()["mean_weight"], f.stats()["pushes_weighted"]) == (None, 0)  # nothing weighed


class Yielding(threading.Condition):
    def __exit__(self, *exc):
        super().__exit__(*exc)
        time.sleep(0.002)


def serve_and_push(rank, world, out: str, policy: str, pushes: int):
    """Rank 0 serves one 64-entry vector from zeros (momentum 0); ranks 1.. push ones at lr N (workers), so
    each applied push moves every entry by exactly -1 and the values say their own version."""
    from ringps.ps.client import Client
    from ringps.ps.layout import flatten_into
    from ringps.record import Recorder

    model = nn.Module()
    model.w = nn.Parameter(torch.zeros(64))
    layout = Layout.of(model, servers=1)
    workers = list(range(1, world))
    if rank == 0:
        cfg = config(workers=len(workers), staleness_threshold=10**6)
        server = Server(0, 0, workers, layout, POLICIES.build(policy, cfg), torch.zeros(64), 0.0, 0.0, timeout=60.0,
                        recorder=Recorder(Path(out), 0))
        # widen every window between the shard lock's release and what follows it: another
        # worker's push lands there, and a version read outside the lock shows at once
        server.shard.cond = Yielding()
        if hasattr(server, "snapshots"):
            server.snapshots.cond = server.shard.cond
        server.serve()
        return server.stats()
    values, grads = flatten_into(model, layout)
    client = Client(rank, (0,), layout, values, grads, timeout=60.0)
    client.pull()
    grads.fill_(1.0)
    seen = []
    for step in range(1, pushes + 1):
        held = -int(values[0])  # the version these values are, counted from the values themselves
        assert torch.all(values == values[0])
        client.push_pull(float(world - 1), step)  # the policy moves a push 1/N of lr: -1 per push
        seen.append((step, held, client.versions[0], -int(values[0])))
    client.stop()
    return seen


@pytest.mark.parametrize("workers, pushes", [(3, 150), (BUFFERS + 3, 40)], ids=["3-workers", "more-than-the-pool"])
def test_reply_version_names_the_values_under_concurrent_pushes(tmp_path, workers, pushes):
    """With more workers than the server's pooled receive buffers and reply snapshots (BUFFERS),
    pushes wait for a buffer and replies share snapshots: still no reply carries other values than
    the version its header names."""
    results = run_ranks(serve_and_push, workers + 1, (str(tmp_path), "threshold", pushes))
    stats, sides = results[0], results[1:]
    for seen in sides:
        for step, held, version, values_version in seen:
            assert version == values_version, f"step {step}: reply says version {version}, values are {values_version}"
    # every push's recorded staleness is the versions applied between the values it was computed
    # on and its own application, counted independently from the values
    held = {(w + 1, step): h for w, seen in enumerate(sides) for step, h, _, _ in seen}
    rows = [json.loads(line) for line in (tmp_path / "ranks" / "rank0.jsonl").read_text().splitlines()]
    applied = [r for r in rows if r["kind"] == "push"]
    assert len(applied) == workers * pushes and stats["pushes_applied"] == workers * pushes
    for r in applied:
        assert r["staleness"] == r["version"] - 1 - held[(r["worker"], r["step"])], r


def test_ssp_holds_a_fast_worker_until_the_slowest_catches_up():
    s = make_server("ssp", workers=(1, 2), momentum=0.0, staleness_threshold=1)
    push(s, 1, 0, torch.zeros(s.n))  # 1 ahead of worker 2: within the bound
    out: list = []
    t = threading.Thread(target=lambda: out.append(push(s, 1, 1, torch.zeros(s.n))), daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive() and s.shard.version == 2  # applied, but its reply waits: 2 ahead of worker 2
    push(s, 2, 0, torch.zeros(s.n))
    t.join(5)
    assert not t.is_alive() and out[0].held > 0  # it was held (how long is a matter of the clock)
    s.timeout = 0.2
    with pytest.raises(Exception, match="waited 0.2s for the slowest worker, rank 2"):
        for v in range(3, 6):
            push(s, 1, v, torch.zeros(s.n))


# -- layer mode -------------------------------------------------------------------------------
def layer_job(rank, world, out: str, policy: str, servers: int, steps: int, methods: list, slow: float, ps: dict):
    """`servers` server ranks first, then workers; a three-layer model, each layer on the server
    and with the method given. Servers return their values, counts and push records; workers
    their (version, values) after every step."""
    import time

    from ringps.ps import layer_server
    from ringps.ps.layer_server import LayerServer
    from ringps.ps.layered import LayeredClient
    from ringps.ps.layers import layer_specs
    from ringps.ps.layout import flatten_into, gather
    from ringps.record import Recorder
    from ringps.schedule.plan import LayerPlan, Plan

    layer_server.LOG_LIMIT = 3  # so a worker that falls behind gets a refresh
    torch.manual_seed(0)
    model = three_layers()
    names = ["0", "2", "4"]
    plan = Plan([LayerPlan(n, "fc", sum(p.numel() for p in model.get_submodule(n).parameters()), m, i, i % servers, 0, 0, 0)
                 for i, (n, m) in enumerate(zip(names, methods))], world - servers, servers, 1e9, 1e9, 0.0, 0.0)
    layout = Layout.of(model, servers).placed({f"{n}.{p}": i % servers for i, n in enumerate(names) for p in ("weight", "bias")})
    specs = layer_specs(model, plan, layout, density=0.1)
    server_ranks, workers = tuple(range(servers)), list(range(servers, world))
    cfg = config(workers=len(workers), **ps)
    if rank < servers:
        flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        server = LayerServer(rank, rank, workers, layout, POLICIES.build(policy, cfg), gather(flat, layout, rank), 0.9,
                             5e-4, timeout=60.0, specs=specs, recorder=Recorder(Path(out), rank), server_ranks=server_ranks)
        history = {0: server.shard.values.clone()}
        orig = server.updated
        server.updated = lambda f, lr, p: (orig(f, lr, p), history.__setitem__(server.shard.version, server.shard.values.clone()))
        server.serve()
        return {"history": history, "applied": server.applied, "dropped": server.dropped}
    values, grads = flatten_into(model, layout)
    sample = cfg.ps.vsgd_sample if POLICIES.get(policy).needs_sample else None
    client = LayeredClient(rank, server_ranks, model, specs, layout, values, grads, 60.0, 0.9, 5e-4, sample_fraction=sample)
    refreshes, entries = [], []
    orig = client._apply_reply

    def spy(s, h, srv):
        if s.method == "sf":
            refreshes.append(bool(h.flags & wire.FLAG_REFRESH))
            entries.append(h.entries)
        return orig(s, h, srv)

    client._apply_reply = spy
    client.refresh()
    g = torch.Generator().manual_seed(rank)
    seen = []
    # the pace, by files rather than by the clock alone (a loaded machine must not reorder it): the
    # slow worker waits until the first worker is 4 steps per step of its own ahead (it falls
    # behind the log, and its pushes are stale); the first waits, half-way, for the slow one's
    # first push (so it replays another worker's update beside its own)
    first, last = servers, world - 1
    paced = last != first  # one worker: nobody to wait for
    progress = Path(out) / "progress"

    def wait_for(cond, what: str) -> None:
        deadline = time.monotonic() + 60
        while not cond():
            assert time.monotonic() < deadline, f"rank {rank}: waited 60 s for {what}"
            time.sleep(0.01)

    def count() -> int:
        return int(progress.read_text() or 0) if progress.is_file() else 0

    for step in range(steps):
        client.begin_step(0.3, step + 1)
        grads.zero_()
        x, y = torch.randn(6, 12, generator=g), torch.randint(0, 4, (6,), generator=g)
        nn.functional.cross_entropy(model(x), y).backward()
        if rank == last and paced:
            time.sleep(slow)
            wait_for(lambda: count() >= min(steps, 4 * (step + 1)), "the first worker's steps")
        if rank == first and paced and step == steps // 2:
            wait_for((Path(out) / "pushed").is_file, "the slow worker's first push")
        client.settle()
        if rank == first:
            tmp = progress.with_suffix(".tmp")
            tmp.write_text(str(step + 1))
            tmp.replace(progress)  # whole, never half-written
        if rank == last and paced:
            (Path(out) / "pushed").touch()
        seen.append((list(client.versions), values.clone()))
    client.close()
    return {"seen": seen, "refreshes": sum(refreshes[1:]), "most_entries": max(entries)}


def three_layers() -> nn.Module:
    """The middle layer is large enough that its sufficient factors (batch 6) are smaller than it."""
    return nn.Sequential(nn.Linear(12, 40), nn.Tanh(), nn.Linear(40, 32), nn.Tanh(), nn.Linear(32, 4))


def shard_of(values: torch.Tensor, layout_servers: int, server: int) -> torch.Tensor:
    model = three_layers()
    names = ["0", "2", "4"]
    layout = Layout.of(model, layout_servers).placed({f"{n}.{p}": i % layout_servers for i, n in enumerate(names)
                                                      for p in ("weight", "bias")})
    from ringps.ps.layout import gather

    return gather(values, layout, server)


@pytest.mark.slow
@pytest.mark.parametrize("policy, ps", [("async", {}), ("stale-lr", {}), ("vsgd", {"vsgd_weight": "linear:0.05"})])
def test_layered_copies_replay_several_workers_updates_exactly(tmp_path, policy, ps):
    """Two workers, factor logs replayed with scales and weights other than 1, a worker that falls
    behind the log (LOG_LIMIT 3) and is refreshed: every copy equals the server's at its version."""
    res = run_ranks(layer_job, 3, (str(tmp_path), policy, 1, 12, ["dense", "sf", "fp16"], 0.15, ps))
    server, workers = res[0], res[1:]
    for w in workers:
        for (version,), values in w["seen"]:
            assert torch.equal(server["history"][version], shard_of(values, 1, 0)), f"{policy}: version {version}"
    assert workers[-1]["refreshes"] > 0  # the slow worker fell more than 3 updates behind
    assert workers[0]["most_entries"] >= 2  # the fast one replayed the other's update beside its own


@pytest.mark.slow
def test_layered_whole_step_applied_or_dropped_on_every_layer_and_server(tmp_path):
    """Two servers, three workers, the last 1:4 slower, threshold T = 1: each worker step is judged
    once (by server 0) and every layer on both servers follows; copies stay exact."""
    res = run_ranks(layer_job, 5, (str(tmp_path), "threshold", 2, 10, ["dense", "sf", "fp16"], 0.2,
                                   {"staleness_threshold": 1}))
    servers, workers = res[:2], res[2:]
    assert servers[0]["dropped"] > 0 and servers[0]["applied"] > 0
    assert (servers[0]["applied"], servers[0]["dropped"]) == (servers[1]["applied"], servers[1]["dropped"])
    records = []
    for r in (0, 1):
        rows = [json.loads(x) for x in (tmp_path / "ranks" / f"rank{r}.jsonl").read_text().splitlines()]
        records.append(sorted((p["worker"], p["step"], p["applied"], p["staleness"]) for p in rows if p["kind"] == "push"))
    assert records[0] == records[1]  # the same verdict and staleness for every step, on both servers
    assert all(s <= 1 for _, _, applied, s in records[0] if applied)
    for w in workers:
        for versions, values in w["seen"]:
            for srv in (0, 1):
                assert torch.equal(servers[srv]["history"][versions[srv]], shard_of(values, 2, srv))
