"""What a server does with a push (DESIGN.md "Parameter server"), one class per policy.

- `sync` (BSP): wait for one push of the version from every live worker, apply their mean.
- `async` (ASGD): apply every push at once.
- `threshold` (expiration): staleness s = server version - push version; drop when s > T.
- `ssp` (Ho et al. 2013): a worker more than T pushes ahead of the slowest live one waits.
- `stale-lr` (Zhang et al. 2016): apply with learning rate lr / max(1, s).
- `dcasgd` (Zheng et al. 2017): g + lambda * g * g * (w_now - w_pulled), w_pulled being the
  values this server last sent that worker.
- `vsgd`: value staleness. Per tensor, d = ||w_now[S] - w_pulled[S]|| / (||w_now[S]|| + eps) on a
  fixed sample S of coordinates whose pulled values the worker sends along; the gradient gets
  weight f(d) (f(0) = 1, decreasing), and is dropped when d exceeds the optional drop distance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ringps.ps import POLICIES

EPS = 1e-12


@dataclass
class Verdict:
    apply: bool
    lr_scale: float = 1.0
    weight: float = 1.0  # mean weight over the shard's tensors (vsgd), for the records
    value_staleness: float = 0.0  # mean relative distance over the shard's tensors (vsgd)
    reason: str = ""


class Policy:
    synchronous = False  # aggregate one push per worker per version (BSP)
    bounded = False  # SSP: a fast worker waits for the slowest
    needs_sample = False  # pushes carry the pulled values at the VSGD sample positions
    needs_backup = False  # the server keeps the values it last sent each worker (DC-ASGD)
    layer_aware = False  # works per layer message (--layer-strategy auto)

    def __init__(self, cfg):
        self.threshold = cfg.ps.staleness_threshold

    def judge(self, staleness: int) -> Verdict:
        return Verdict(True)

    def transform(self, grad: torch.Tensor, w_now: torch.Tensor, backup: Optional[torch.Tensor]) -> torch.Tensor:
        return grad


@POLICIES.register("sync")
class Sync(Policy):
    synchronous = True


@POLICIES.register("async")
class Async(Policy):
    layer_aware = True


@POLICIES.register("threshold")
class Threshold(Policy):
    layer_aware = True

    def judge(self, staleness: int) -> Verdict:
        if staleness > self.threshold:
            return Verdict(False, reason=f"staleness {staleness} > T={self.threshold}")
        return Verdict(True)


@POLICIES.register("ssp")
class SSP(Policy):
    bounded = True


@POLICIES.register("stale-lr")
class StaleLR(Policy):
    layer_aware = True

    def judge(self, staleness: int) -> Verdict:
        return Verdict(True, lr_scale=1.0 / max(1, staleness))


@POLICIES.register("dcasgd")
class DCASGD(Policy):
    needs_backup = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lam = cfg.ps.dcasgd_lambda

    def transform(self, grad, w_now, backup):
        if backup is None:
            return grad
        return grad + self.lam * grad * grad * (w_now - backup)


# -- VSGD weight functions: f(0) = 1, decreasing in d; `scale` is where f has fallen noticeably
WEIGHTS: dict[str, Callable[[float, float], float]] = {
    "exp": lambda d, s: math.exp(-d / s),
    "inverse": lambda d, s: 1.0 / (1.0 + d / s),
    "linear": lambda d, s: max(0.0, 1.0 - d / s),
    "none": lambda d, s: 1.0,  # measures value staleness, weighs nothing (the ablation)
}


def parse_weight(spec: str) -> tuple[str, float]:
    """'inverse:0.01' -> ('inverse', 0.01). Raises ValueError naming the forms allowed."""
    name, _, scale = spec.partition(":")
    if name not in WEIGHTS:
        raise ValueError(f"unknown weight function {name!r}; known: {', '.join(WEIGHTS)} (as NAME:SCALE)")
    try:
        s = float(scale) if scale else 0.01
    except ValueError:
        raise ValueError(f"scale {scale!r} is not a number") from None
    if not s > 0:
        raise ValueError("the scale must be > 0")
    return name, s


@POLICIES.register("vsgd")
class VSGD(Policy):
    needs_sample = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.fraction = cfg.ps.vsgd_sample
        name, self.scale = parse_weight(cfg.ps.vsgd_weight)
        self.f = WEIGHTS[name]
        self.drop = cfg.ps.vsgd_drop

    def distances(self, w_now: torch.Tensor, sample_pos: list[torch.Tensor], pulled: torch.Tensor) -> list[float]:
        """Relative distance per tensor between the server's values and the pulled ones."""
        out, start = [], 0
        for pos in sample_pos:
            now, was = w_now[pos], pulled[start : start + pos.numel()]
            start += pos.numel()
            out.append(float(torch.linalg.vector_norm(now - was) / (torch.linalg.vector_norm(now) + EPS)))
        return out

    def weights(self, distances: list[float]) -> list[float]:
        return [self.f(d, self.scale) for d in distances]

    def judge_values(self, distances: list[float]) -> Verdict:
        d = max(distances) if distances else 0.0
        w = self.weights(distances)
        mean_d = sum(distances) / max(1, len(distances))
        mean_w = sum(w) / max(1, len(w))
        if self.drop is not None and d > self.drop:
            return Verdict(False, weight=0.0, value_staleness=mean_d, reason=f"value distance {d:.3g} > {self.drop:g}")
        return Verdict(True, weight=mean_w, value_staleness=mean_d)
