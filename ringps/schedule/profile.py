"""Per-layer profile of a model on this machine: parameter bytes, forward and backward time, and
for each parameter how much backward compute is left once its gradient is ready (the window in
which its communication can hide).

Forward time comes from forward pre/post hooks on each module that owns parameters; backward
time from the moments the parameters' gradients become ready (post-accumulate-grad hooks), which
works with in-place activations, unlike module backward hooks. Medians over a few repetitions.
On a GPU every stamp first waits for the device's queued kernels (`_clock`): a module's forward
returns, and a gradient's hook runs, once its kernels are queued, so stamps without the wait would
time the launches, not the work.

The CPU a parameter server spends per update is measured too, on the layer's real sizes: one
momentum-SGD step over its parameters (`update_s`) and, for a fully connected layer, rebuilding
its weight gradient from sufficient factors, delta^T x (`rebuild_s`). A worker replays both for
every update of a sufficient-factor layer it pulls, on the path of its next forward, so guessing
them from a per-element constant measured on small cache-resident tensors under-predicts the step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LayerProfile:
    name: str  # module name
    kind: str  # conv, fc, other
    params: int  # entries
    param_bytes: int
    forward_s: float
    backward_s: float
    shape: tuple = ()  # weight shape (out, in[, kh, kw])
    in_features: int = 0
    out_features: int = 0
    update_s: float = 0.0  # one momentum-SGD step over this layer's parameters (0: not measured)
    rebuild_s: float = 0.0  # fc: delta^T x for one batch (0: not measured)


@dataclass
class Profile:
    layers: list[LayerProfile]  # forward order
    forward_s: float
    backward_s: float
    batch: int
    overlap_s: dict[str, float] = field(default_factory=dict)  # param name -> backward left when ready

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s


def _kind(m: nn.Module) -> str:
    if isinstance(m, nn.Linear):
        return "fc"
    if isinstance(m, nn.modules.conv._ConvNd):
        return "conv"
    return "other"


def _clock(device: torch.device) -> Callable[[], float]:
    """perf_counter, after the device's queued kernels have run (on the CPU, perf_counter)."""
    if device.type != "cuda":
        return time.perf_counter

    def now() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()
    return now


def _median_time(fn, reps: int = 3, now: Callable[[], float] = time.perf_counter) -> float:
    fn()  # warm-up: allocations, caches
    times = []
    for _ in range(reps):
        t0 = now()
        fn()
        times.append(now() - t0)
    return statistics.median(times)


def update_costs(params: int, batch: int, in_features: int, out_features: int,
                 device: torch.device = torch.device("cpu")) -> tuple[float, float]:
    """(update_s, rebuild_s) measured with the operations the server and a replaying worker run:
    the momentum-SGD step with weight decay (what ringps.ps.server.sgd_step does) and delta^T x,
    on `device` (the model's: a worker's optimizer step runs where its parameters live)."""
    values, momentum, grad = (torch.zeros(params, device=device) for _ in range(3))
    now = _clock(device)

    def update() -> None:
        grad.add_(values, alpha=5e-4)
        momentum.mul_(0.9).add_(grad)
        values.add_(momentum, alpha=-0.01)

    rebuild = 0.0
    if in_features:
        delta, x = torch.randn(batch, out_features, device=device), torch.randn(batch, in_features, device=device)
        out = grad[: in_features * out_features].view(out_features, in_features)
        rebuild = _median_time(lambda: torch.mm(delta.t(), x, out=out), now=now)
    return _median_time(update, now=now), rebuild


def profile_model(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, reps: int = 3,
                  update_device: Optional[torch.device] = None) -> Profile:
    """The model's profile on its inputs' device; the updates (`update_s`, `rebuild_s`) on
    `update_device`, default the same (a parameter server's updates run on its host's CPU)."""
    owners = [(n, m) for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
    fwd: dict[str, list[float]] = {n: [] for n, _ in owners}
    ready: dict[str, list[float]] = {}
    totals_f, totals_b = [], []
    starts: dict[str, float] = {}
    handles = []
    now = _clock(inputs.device)
    for n, m in owners:
        handles.append(m.register_forward_pre_hook(lambda mod, inp, n=n: starts.__setitem__(n, now())))
        handles.append(m.register_forward_hook(lambda mod, inp, out, n=n: fwd[n].append(now() - starts[n])))
    stamp: dict[str, float] = {}
    for pname, p in model.named_parameters():
        handles.append(p.register_post_accumulate_grad_hook(lambda t, pname=pname: stamp.__setitem__(pname, now())))
    was_training = model.training
    model.train()
    rng = torch.get_rng_state()  # dropout draws here must not shift the training run's randomness
    try:
        for rep in range(reps + 1):  # the first repetition warms caches up and is discarded
            stamp.clear()
            model.zero_grad(set_to_none=True)
            t0 = now()
            loss = F.cross_entropy(model(inputs), targets)
            t1 = now()
            loss.backward()
            t2 = now()
            if rep == 0:
                for v in fwd.values():
                    v.clear()
                continue
            totals_f.append(t1 - t0)
            totals_b.append(t2 - t1)
            for pname, t in stamp.items():
                ready.setdefault(pname, []).append(t - t1)
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
        model.train(was_training)
        torch.set_rng_state(rng)
    bwd_total = statistics.median(totals_b)
    ready_at = {p: statistics.median(v) for p, v in ready.items()}
    layers = []
    # backward time of a layer: from the previous layer's (in backward order) grads to its own
    order = sorted(owners, key=lambda nm: max(ready_at.get(f"{nm[0]}.{pn}" if nm[0] else pn, 0.0)
                                               for pn, _ in nm[1].named_parameters(recurse=False)))
    prev = 0.0
    bwd: dict[str, float] = {}
    for n, m in order:
        t = max(ready_at.get(f"{n}.{pn}" if n else pn, 0.0) for pn, _ in m.named_parameters(recurse=False))
        bwd[n], prev = max(0.0, t - prev), t
    for n, m in owners:
        ps = list(m.parameters(recurse=False))
        w = getattr(m, "weight", None)
        params = sum(p.numel() for p in ps)
        fin, fout = getattr(m, "in_features", 0), getattr(m, "out_features", 0)
        update_s, rebuild_s = update_costs(params, int(inputs.shape[0]), fin, fout, update_device or inputs.device)
        layers.append(LayerProfile(
            name=n, kind=_kind(m), params=params,
            param_bytes=sum(p.numel() * p.element_size() for p in ps),
            forward_s=statistics.median(fwd[n]) if fwd[n] else 0.0, backward_s=bwd.get(n, 0.0),
            shape=tuple(w.shape) if w is not None else (),
            in_features=fin, out_features=fout, update_s=update_s, rebuild_s=rebuild_s,
        ))
    overlap = {p: max(0.0, bwd_total - t) for p, t in ready_at.items()}
    return Profile(layers, statistics.median(totals_f), bwd_total, int(inputs.shape[0]), overlap)
