"""What a server does with a push (DESIGN.md "Parameter server"), one class per policy.

- `sync` (BSP): wait for one push of the version from every live worker, apply their mean.
- `async` (ASGD): apply every push at once.
- `threshold` (expiration): staleness s = server version - push version; drop when s > T
  (default T = 2 x (workers - 1)).
- `ssp` (Ho et al. 2013): a worker more than T pushes ahead of the slowest live one waits.
- `stale-lr` (Zhang et al. 2016): apply with learning rate lr / max(1, s).
- `dcasgd` (Zheng et al. 2017): g + lambda * g * g * (w_now - w_pulled), w_pulled being the
  values this server last sent that worker. `--dcasgd-adaptive` is the paper's DC-ASGD-a:
  lambda / sqrt(v) per entry, v a running mean of g * g (m = 0.95), which makes the correction
  independent of the gradient's scale (a constant lambda times g * g can vanish for small gradients).
- `vsgd`: value staleness. Per tensor, d = ||w_now[S] - w_pulled[S]|| / (||w_now[S]|| + eps) on a
  fixed sample S of coordinates whose pulled values the worker sends along; the gradient gets
  weight f(d) (f(0) = 1, decreasing), and is dropped when d exceeds the optional drop distance.
  With `relative:K` the scale is not fixed: it is K times the median d of the tensor's recent
  pushes, so a gradient as fresh as usual keeps its whole step and only the unusually far ones
  are weighed down, by K * median / d (a gradient's error grows about linearly with d).
  `--vsgd-scope push` gives the whole push one weight, the median of its tensors' weights: it
  shortens the step without turning it (per tensor, layers that moved more are weighed down
  more, which changes the update's direction).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
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
    weights: tuple[float, ...] = ()  # vsgd: the weight of each of the shard's tensors


class Policy:
    synchronous = False  # aggregate one push per worker per version (BSP)
    bounded = False  # SSP: a fast worker waits for the slowest
    needs_sample = False  # pushes carry the pulled values at the VSGD sample positions
    needs_backup = False  # the server keeps the values it last sent each worker (DC-ASGD)
    layer_aware = False  # works per layer message (--layer-strategy auto)
    uses_threshold = False  # reads --staleness-threshold (threshold, ssp)

    DEFAULT_THRESHOLD = 4  # ssp: how many pushes a worker may run ahead of the slowest

    def __init__(self, cfg):
        t = cfg.ps.staleness_threshold
        self.threshold = self.default_threshold(cfg.run.workers) if t is None else t

    def default_threshold(self, workers: int) -> int:
        return self.DEFAULT_THRESHOLD

    def judge(self, staleness: int) -> Verdict:
        return Verdict(True)

    def transform(self, grad: torch.Tensor, w_now: torch.Tensor, backup: Optional[torch.Tensor]) -> torch.Tensor:
        return grad

    def state_dict(self) -> dict:
        """What the policy learned from past pushes; goes into the server's checkpoint."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@POLICIES.register("sync")
class Sync(Policy):
    synchronous = True


@POLICIES.register("async")
class Async(Policy):
    layer_aware = True


@POLICIES.register("threshold")
class Threshold(Policy):
    layer_aware = True
    uses_threshold = True

    def default_threshold(self, workers: int) -> int:
        # with N workers of one speed a push is about N - 1 versions stale (each other worker
        # pushed once meanwhile); twice that keeps a worker up to ~2x slower than the rest and
        # drops the ones slower still (T = 4, 6, 8 at N = 4 measured: docs/RESULTS.md)
        return 2 * (workers - 1)

    def judge(self, staleness: int) -> Verdict:
        if staleness > self.threshold:
            return Verdict(False, reason=f"staleness {staleness} > T={self.threshold}")
        return Verdict(True)


@POLICIES.register("ssp")
class SSP(Policy):
    bounded = True
    uses_threshold = True


@POLICIES.register("stale-lr")
class StaleLR(Policy):
    layer_aware = True

    def judge(self, staleness: int) -> Verdict:
        return Verdict(True, lr_scale=1.0 / max(1, staleness))


@POLICIES.register("dcasgd")
class DCASGD(Policy):
    needs_backup = True

    MEAN_SQUARE = 0.95  # DC-ASGD-a's m (Zheng et al. 2017)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.lam = cfg.ps.dcasgd_lambda
        self.adaptive = cfg.ps.dcasgd_adaptive
        self.mean_square: Optional[torch.Tensor] = None  # adaptive: running mean of g * g, per entry

    def transform(self, grad, w_now, backup):
        # in place and with one temporary: the server holds the shard's lock meanwhile, and on a
        # 10 M-entry shard every extra pass over it is time all workers wait
        if self.adaptive:
            if self.mean_square is None:
                self.mean_square = grad * grad
            else:
                self.mean_square.mul_(self.MEAN_SQUARE).addcmul_(grad, grad, value=1 - self.MEAN_SQUARE)
        if backup is None:
            return grad
        c = torch.sub(w_now, backup).mul_(grad).mul_(grad)
        if self.adaptive:
            c.div_(self.mean_square.sqrt().add_(1e-7))  # lambda / sqrt(v), per entry
        return grad.add_(c, alpha=self.lam)

    def state_dict(self) -> dict:
        return {"mean_square": self.mean_square} if self.mean_square is not None else {}

    def load_state_dict(self, state: dict) -> None:
        self.mean_square = state.get("mean_square", self.mean_square)


# -- VSGD weight functions: f(0) = 1, decreasing in d; `scale` is where f has fallen noticeably
WEIGHTS: dict[str, Callable[[float, float], float]] = {
    "exp": lambda d, s: math.exp(-d / s),
    "inverse": lambda d, s: 1.0 / (1.0 + d / s),
    "linear": lambda d, s: max(0.0, 1.0 - d / s),
    "none": lambda d, s: 1.0,  # measures value staleness, weighs nothing (the ablation)
    "relative": lambda d, s: 1.0 if d <= s else s / d,  # s: K x the tensor's recent median d
}
DEFAULT_SCALE = {"relative": 2.0}
RECENT = 64  # pushes whose distances set a tensor's typical d (relative)
WARMUP = 8  # fewer pushes than this seen: every weight is 1 (nothing is typical yet)


def parse_weight(spec: str) -> tuple[str, float]:
    """'inverse:0.01' -> ('inverse', 0.01). Raises ValueError naming the forms allowed."""
    name, _, scale = spec.partition(":")
    if name not in WEIGHTS:
        raise ValueError(f"unknown weight function {name!r}; known: {', '.join(WEIGHTS)} (as NAME:SCALE)")
    try:
        s = float(scale) if scale else DEFAULT_SCALE.get(name, 0.01)
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
        self.relative = name == "relative"
        self.recent: list[deque] = []  # per tensor, its last RECENT distances (relative)
        self.drop = cfg.ps.vsgd_drop
        self.per_push = cfg.ps.vsgd_scope == "push"

    def distances(self, w_now: torch.Tensor, sample_pos: list[torch.Tensor], pulled: torch.Tensor) -> list[float]:
        """Relative distance per tensor between the server's values and the pulled ones. One gather
        and two segment sums for all tensors (the server holds its shard lock meanwhile; a loop of
        small per-tensor ops took 1.9 ms on facenet's 12 tensors)."""
        if not sample_pos:
            return []
        lengths = torch.tensor([p.numel() for p in sample_pos])
        now = w_now.index_select(0, torch.cat(sample_pos))
        moved = torch.segment_reduce((now - pulled).square_(), "sum", lengths=lengths)
        norm = torch.segment_reduce(now.square_(), "sum", lengths=lengths)
        return (moved.sqrt_() / norm.sqrt_().add_(EPS)).tolist()

    def scales(self, n: int) -> list[float]:
        if not self.relative:
            return [self.scale] * n
        if len(self.recent) != n or len(self.recent[0]) < WARMUP:
            return [math.inf] * n  # every weight 1 until a typical distance is known
        return [self.scale * statistics.median(r) for r in self.recent]

    def weights(self, distances: list[float]) -> list[float]:
        return [self.f(d, s) for d, s in zip(distances, self.scales(len(distances)))]

    def observe(self, distances: list[float]) -> None:
        """Remember the distances (relative: they set what is typical). The server calls this under
        its shard lock, so pushes are observed one at a time."""
        if self.relative:
            if len(self.recent) != len(distances):
                self.recent = [deque(maxlen=RECENT) for _ in distances]
            for r, d in zip(self.recent, distances):
                r.append(d)

    def state_dict(self) -> dict:
        return {"recent": [list(r) for r in self.recent]}

    def load_state_dict(self, state: dict) -> None:
        self.recent = [deque(r, maxlen=RECENT) for r in state.get("recent", [])]

    def judge_values(self, distances: list[float]) -> Verdict:
        d = max(distances) if distances else 0.0
        w = self.weights(distances)
        if self.per_push and w:
            w = [statistics.median(w)] * len(w)
        self.observe(distances)
        mean_d = sum(distances) / max(1, len(distances))
        mean_w = sum(w) / max(1, len(w))
        if self.drop is not None and d > self.drop:
            return Verdict(False, weight=0.0, value_staleness=mean_d, reason=f"value distance {d:.3g} > {self.drop:g}")
        return Verdict(True, weight=mean_w, value_staleness=mean_d, weights=tuple(w))
