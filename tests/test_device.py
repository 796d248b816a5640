"""The hook's path keeps every tensor on its gradients' device (NCCL takes CUDA tensors only).

No GPU here, so the test makes the mistake visible on the CPU: with the default device set to
`meta`, any tensor the hook, an exchange, a selector or a memory makes without naming a device
lands on `meta`, where gloo refuses it and mixed-device ops fail. The gradients stay on the CPU,
and the results must equal the same calls' without the default device changed.
"""

from __future__ import annotations

import pytest
import torch
from conftest import run_ranks

from ringps.comm.exchanges import EXCHANGES, Segment, build_exchange
from ringps.comm.p2p import Ring
from ringps.compress.memory import MEMORIES
from ringps.compress.selectors import SELECTORS

pytestmark = pytest.mark.slow
SPARSE = [n for n in EXCHANGES.names() if not EXCHANGES.get(n).whole]


def reduce_every_way(rank, world, on_meta):
    """Each sparse exchange with each selector over 3 steps of error feedback (DGC's memory too)."""
    ring = Ring(None, timeout=30.0)
    out = {}
    for name in SPARSE:
        for sel_name in SELECTORS.names():
            for mem_name in ("ef", "dgc"):
                ex = build_exchange(name, block=16)
                sel = SELECTORS.build(sel_name) if sel_name == "topk" else SELECTORS.build(sel_name, seed=3)
                mem = MEMORIES.build(mem_name, 0.9)
                # sizes that do not divide into blocks or ranks evenly; the first one large enough
                # for the sampled threshold to sample
                sizes = [9001, 333]
                acc = torch.zeros(sum(sizes))
                offset = 0
                for i, n in enumerate(sizes):
                    mem.place(f"t{i}", acc[offset : offset + n])
                    offset += n
                results = []
                for step in range(3):
                    g = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(100 * rank + step))
                    segs, offset = [], 0
                    for i, n in enumerate(sizes):
                        mem.compensate(f"t{i}", g[offset : offset + n])
                        segs.append(Segment(offset, n, max(1, n // 20), 7 + i, f"t{i}", g[offset : offset + n]))
                        offset += n
                    dest = torch.empty_like(acc)
                    if on_meta:
                        torch.set_default_device("meta")
                    try:
                        red = ex.reduce(acc, segs, sel, ring, step, dest)
                    finally:
                        torch.set_default_device(None)
                    for s in segs:
                        sent = None if red.sent is None else red.sent[(red.sent >= s.offset) & (red.sent < s.offset + s.numel)]
                        mem.update(s.name, None if sent is None else sent - s.offset)
                    results.append(dest.clone())
                out[(name, sel_name, mem_name)] = torch.stack(results)
    return out


def test_exchanges_make_no_tensor_off_their_inputs_device():
    plain = run_ranks(reduce_every_way, 3, (False,))
    meta = run_ranks(reduce_every_way, 3, (True,))
    for key, value in plain[0].items():
        for r in range(3):
            assert meta[r][key].device.type == "cpu"
            assert torch.equal(meta[r][key], value), key  # the same sums, and the same on every rank


def hook_training(rank, world, on_meta):
    """Six SGD steps at momentum 0.9 through DDP with ring_topk_hook: each exchange forced, and
    auto (which probes the links, times the CPU's operations and the first steps' compute), with
    small tensors deferred to the fused message and DGC's memory on one of them."""
    import torch.nn as nn
    from helpers import batches
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ringps.hooks import RingTopkState, ring_topk_hook
    from ringps.models import build_model

    out = {}
    for exchange in [*SPARSE, "dense", "dense-fp16", "auto"]:
        torch.manual_seed(0)
        model = build_model("mlp", (1, 8, 8), 4)
        net = DDP(model, bucket_cap_mb=0.02)
        state = RingTopkState(density=0.05, exchange=exchange, dense_below=64, block=8,
                              memory="dgc" if exchange == "allgather" else "ef").bind(model)
        net.register_comm_hook(state, ring_topk_hook)
        if on_meta:  # the default device is per thread: the hook's work runs on its own
            state.thread.submit(lambda: torch.set_default_device("meta")).wait()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for batch in batches(6, 8, seed=rank):
            opt.zero_grad()
            nn.functional.cross_entropy(net(batch.inputs), batch.targets).backward()
            opt.step()
        state.close()
        out[exchange] = torch.cat([p.detach().flatten() for p in model.parameters()])
    return out


def test_the_hook_makes_no_tensor_off_the_gradients_device():
    plain = run_ranks(hook_training, 2, (False,))
    meta = run_ranks(hook_training, 2, (True,))
    for exchange, value in plain[0].items():
        assert torch.equal(meta[0][exchange], meta[1][exchange]), exchange  # replicas stay identical
        if exchange != "auto":  # auto's choices follow timings, which differ from run to run
            assert torch.equal(meta[0][exchange], value), exchange
