"""The cost model's exchange choice: sparse where it pays per unit of progress, dense otherwise."""

from __future__ import annotations

import pytest

from ringps.comm.exchanges import EXCHANGES, choose_exchange, price
from ringps.cost import CostParams

N_, K_ = 10_000_000, 100_000


def test_slow_link_goes_sparse_and_shared_index_sends_least():
    p = CostParams(bandwidth=100e6 / 8, latency=1e-4)
    name, costs = choose_exchange(N_, K_, 4, p, compute_s=1.0, progress=0.57)
    assert name == "shared-index"
    assert costs["shared-index"] < 0.1 * costs["dense"]
    sent = {c: price(c, N_, K_, 4, p).bytes_sent for c in ("dense", "allgather", "shared-index")}
    assert sent["shared-index"] < sent["allgather"] < sent["dense"]


@pytest.mark.parametrize("compute_s", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("progress", [1.0, 0.57, 0.3])
def test_sparse_only_where_the_step_per_unit_of_progress_is_shorter(compute_s, progress):
    """Over link speeds from 10 Mbit/s to 100 Gbit/s the choice is sparse exactly where
    (compute + sparse) / progress < compute + dense (the cheaper of fp32 and 16-bit dense), and it
    flips once, from sparse to dense."""
    picks = []
    for bw in (1.25e6, 1.25e7, 1.25e8, 1.25e9, 1.25e10):
        p = CostParams(bandwidth=bw, latency=1e-5)
        name, costs = choose_exchange(N_, K_, 4, p, compute_s=compute_s, progress=progress)
        cheapest = min((c for c in costs if not EXCHANGES.get(c).whole), key=costs.get)
        dense = min(("dense", "dense-fp16"), key=lambda c: (costs[c], c != "dense"))
        pays = (compute_s + costs[cheapest]) / progress < compute_s + costs[dense]
        assert name == (cheapest if pays else dense), (bw, costs)
        picks.append(EXCHANGES.get(name).whole)
    assert picks == sorted(picks), picks  # sparse on the slow links, dense on the fast ones


def test_a_slower_sparse_progress_keeps_a_1gbit_link_dense():
    """This machine's 1 Gbit/s setting (measured constants, ~1 s of compute per step): priced by
    step time alone sparse wins; priced per unit of progress (0.57) dense does, in 16 bits where
    dense-fp16 is a candidate (as by default)."""
    p = CostParams(bandwidth=1.26e8, latency=3.6e-4, pass_s=4.4e-10, reduce_s=4.7e-10, scatter_s=6.8e-9, select_s=4.6e-9)
    assert choose_exchange(10_600_000, 106_000, 4, p, compute_s=1.0, progress=1.0)[0] == "shared-index"
    assert choose_exchange(10_600_000, 106_000, 4, p, compute_s=1.0, progress=0.57)[0] == "dense-fp16"
    assert choose_exchange(10_600_000, 106_000, 4, p, compute_s=1.0, progress=0.57,
                           candidates=("dense", "allgather", "shared-index"))[0] == "dense"
    assert choose_exchange(10_600_000, 106_000, 4, CostParams(bandwidth=1.25e7, latency=2e-4), compute_s=1.0,
                           progress=0.57)[0] == "shared-index"  # 100 Mbit/s


def test_each_exchange_is_weighed_by_what_its_update_carries():
    """The constants ring-topk measured on facenet, 4 workers: at 1 Gbit/s allgather's update (every
    rank's own k, 0.88 of a dense step) pays for its extra bytes over shared-index's (k common
    entries, 0.65); at 100 Mbit/s the bytes dominate and shared-index stays; an explicit
    `progress` prices every sparse exchange alike, and then the cheapest of them wins."""
    from ringps.comm.exchanges import EXCHANGES

    assert EXCHANGES.get("dense").progress == 1.0
    assert EXCHANGES.get("shared-index").progress < EXCHANGES.get("allgather").progress < 1.0
    n, k = 10_618_368, 106_183
    compute = 0.245 * n / 10_695_144  # the bucket's share of the step's compute
    gbit = CostParams(bandwidth=1.23e8, latency=1.42e-4, pass_s=8.7e-11, reduce_s=9.7e-11, scatter_s=1.17e-8, select_s=2.2e-9)
    mbit = CostParams(bandwidth=1.11e7, latency=1e-4, pass_s=6.2e-11, reduce_s=8.2e-11, scatter_s=4.4e-9, select_s=1.3e-9)
    name, costs = choose_exchange(n, k, 4, gbit, compute_s=compute)
    assert name == "allgather" and costs["allgather"] > costs["shared-index"]
    assert choose_exchange(n, k, 4, mbit, compute_s=compute)[0] == "shared-index"
    assert choose_exchange(n, k, 4, gbit, compute_s=compute, progress=0.65)[0] == "shared-index"
