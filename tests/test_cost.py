"""The cost model's exchange choice: sparse where it clearly saves, dense otherwise."""

from __future__ import annotations

from ringps.cost import SPARSE_MARGIN, CostParams, choose_exchange, exchange_cost


def test_slow_link_goes_sparse_and_shared_index_sends_least():
    p = CostParams(bandwidth=100e6 / 8, latency=1e-4)
    name, costs = choose_exchange(10_000_000, 100_000, 4, p)
    assert name == "shared-index"
    assert costs["shared-index"] < 0.1 * costs["dense"]
    sent = {c: exchange_cost(c, 10_000_000, 100_000, 4, p).bytes_sent for c in ("dense", "allgather", "shared-index")}
    assert sent["shared-index"] < sent["allgather"] < sent["dense"]


def test_dense_wins_unless_sparse_saves_the_margin():
    """Find a link speed where the cheapest sparse exchange is priced just under dense, and one
    where it saves more than the margin: only the second goes sparse."""
    n, k, N = 2_000_000, 20_000, 4
    picks = {}
    for bw in (1e8, 3e8, 1e9, 3e9, 1e10, 3e10, 1e11):
        p = CostParams(bandwidth=bw, latency=1e-5)
        name, costs = choose_exchange(n, k, N, p)
        cheapest = min((c for c in costs if c != "dense"), key=costs.get)
        saving = 1 - costs[cheapest] / costs["dense"]
        picks[bw] = (name, saving)
        assert name == (cheapest if saving >= SPARSE_MARGIN else "dense"), (bw, costs)
    assert any(n == "dense" for n, _ in picks.values()) and any(n != "dense" for n, _ in picks.values()), picks
    assert any(0 < s < SPARSE_MARGIN for _, s in picks.values()), picks  # the margin decided at least once
