"""Measure the links the workers really have: latency and bandwidth of all-reduce on the group.

Used to feed the cost model in the same units it predicts in. All ranks take part and get the
same answer (times are max-reduced), so decisions derived from it agree everywhere. Everything is
measured on the device the exchanges run on (`device`: NCCL takes CUDA tensors only, and a GPU's
selection costs are not the CPU's).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ringps.cost import CostParams


def _sync(device) -> None:
    """Wait for the device's queued kernels (NCCL's collectives return once queued): a no-op on CPU."""
    if torch.device(device or "cpu").type == "cuda":
        torch.cuda.synchronize(device)


def _timed(t: torch.Tensor, group, reps: int) -> float:
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        _sync(t.device)
        t0 = time.perf_counter()
        dist.all_reduce(t, group=group)
        _sync(t.device)
        times.append(time.perf_counter() - t0)
    worst = torch.tensor([min(times)], dtype=torch.float64, device=t.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return float(worst)


def measure_links(group=None, nbytes: int = 4 << 20, reps: int = 3, device=None) -> tuple[float, float]:
    """(latency per message in s, bandwidth in bytes/s per link) seen by a ring all-reduce."""
    n = dist.get_world_size(group)
    if n == 1:
        return 0.0, float("inf")
    small = _timed(torch.zeros(1, device=device), group, reps)
    large = _timed(torch.zeros(nbytes // 4, device=device), group, reps)
    msgs = 2 * (n - 1)
    latency = small / msgs
    moved = 2 * (n - 1) / n * nbytes
    bandwidth = moved / max(large - msgs * latency, 1e-6)
    return latency, bandwidth


def broadcast_object(obj, group=None, src_index: int = 0):
    """Rank `src_index` of the group's object, on every rank of the group."""
    box = [obj]
    src = dist.get_global_rank(group, src_index) if group is not None else src_index
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def measured_cost_params(group=None, calibrate: bool = True, device=None) -> CostParams:
    latency, bandwidth = measure_links(group, device=device)
    cpu = calibrate_cpu(device=device) if calibrate and dist.get_rank(group) == 0 else {}
    cpu = broadcast_object(cpu, group)
    return CostParams(bandwidth=bandwidth, latency=latency, **cpu)


def _time(fn, reps: int = 3, device=None) -> float:
    best = float("inf")
    for _ in range(reps):
        _sync(device)  # a kernel's time, not its launch's
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def calibrate_cpu(n: int = 1 << 21, density: float = 0.01, device=None) -> dict[str, float]:
    """Per-element costs of the operations the exchanges really run, on `device` (the CPU's by
    default: what the names say; on a GPU its kernels')."""
    from ringps.compress.selectors import SampledThreshold

    rand = torch.Generator().manual_seed(0)  # leaves the global RNG alone
    g = torch.randn(n, generator=rand, device="cpu").to(device)
    k = max(1, int(n * density))
    sel = SampledThreshold()
    chosen = sel.select(g, k)
    out = torch.zeros(n, device=device)
    a, b = (torch.randn(16, m, generator=rand, device="cpu").to(device) for m in (1024, 2048))
    return {
        "flop_s": _time(lambda: a.t() @ b, device=device) / (16 * 1024 * 2048),
        "select_s": _time(lambda: sel.select(g, k), device=device) / n,
        "scatter_s": _time(lambda: out.index_add_(0, chosen.indices, chosen.values), device=device) / max(1, chosen.indices.numel()),
        "pass_s": _time(lambda: out.zero_().add_(g), device=device) / (2 * n),
        "reduce_s": _time(lambda: out.add_(g), device=device) / n,
    }


def device_rates(n: int = 1 << 24, reps: int = 5, device=None) -> tuple[float, float]:
    """The device's memory bandwidth (GB/s, a dense pass over `n` floats, well past the caches)
    and FP32 rate (TFLOPS, a matrix product): the rates a workload profile records
    (`ringps.sim.workload.Kernels`), best of `reps` (other tenants only ever slow a kernel down)."""
    rand = torch.Generator().manual_seed(0)
    g = torch.randn(n, generator=rand, device="cpu").to(device)
    out = torch.zeros(n, device=device)
    a, b = (torch.randn(256, m, generator=rand, device="cpu").to(device) for m in (1024, 1024))
    pass_s = _time(lambda: out.zero_().add_(g), reps, device) / (2 * n)  # 16 bytes moved per 2 element-passes
    mac_s = _time(lambda: a.t() @ b, reps, device) / (256 * 1024 * 1024)
    return 8 / pass_s / 1e9, 2 / mac_s / 1e12
