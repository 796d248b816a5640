"""Sparse exchanges: sum k-sparse vectors over N workers and return the average, dense.

Each exchange takes the accumulated gradient `acc` of a bucket (flat), the bucket's segments
(one per large tensor, with its own k), a selector and an `out` buffer of acc's size; it writes
the averaged update into `out` and returns the local positions that count as sent (the memory
keeps the rest). `reduce` runs three phases, kept apart so `ringps bench comm` can time the
communication alone: `prepare` (local: the selection, or shared-index's block scores), `combine`
(the messages: every rank ends with the same summed contributions) and `write` (local: the
average into `out`). Each exchange prices itself (`cost`), so `exchange="auto"` weighs every
registered one. Every rank applies the same bits: sums run in rank order or each element is
summed once.

Adding an exchange: one file in this folder, and its import line below.
"""

# the registry: one line per exchange
from ringps.comm.exchanges import (
    allgather,  # noqa: E402,F401
    dense,  # noqa: E402,F401
    gloo_allgather,  # noqa: E402,F401
    shared_index,  # noqa: E402,F401
    sparse_rs,  # noqa: E402,F401
)
from ringps.comm.exchanges.base import (  # noqa: F401
    EXCHANGES,
    VALUE_DTYPES,
    Exchange,
    Reduced,
    Segment,
    auto_candidates,
    build_exchange,
    choose_exchange,
    faithful_candidates,
    price,
    progress_of,
    tail_start,
)
from ringps.comm.exchanges.shared_index import SharedIndex  # noqa: E402,F401
