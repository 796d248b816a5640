"""`vsgd`: value staleness. Per tensor, d = ||w_now[S] - w_pulled[S]|| / (||w_now[S]|| + eps) on a
fixed sample S of coordinates whose pulled values the worker sends along; the gradient gets
weight f(d) (f(0) = 1, decreasing), and the step is dropped when d exceeds the optional drop
distance (judged by server 0 on its tensors when there are several servers; every server weighs
its own tensors). With `relative:K` the scale is not fixed: it is K times the median d of the
tensor's recent pushes, so a gradient as fresh as usual keeps its whole step and only the
unusually far ones are weighed down, by K * median / d (a gradient's error grows about linearly
with d). `--vsgd-scope push` gives the whole push one weight, the median of its tensors' weights:
it shortens the step without turning it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Callable

import torch

from ringps.ps import POLICIES
from ringps.ps.policies.base import Policy, Push, Verdict

EPS = 1e-12

# -- weight functions: f(0) = 1, decreasing in d; `scale` is where f has fallen noticeably
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
    judged = True  # the drop distance
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

    def judge_values(self, distances: list[float], drop: bool = True) -> Verdict:
        """The verdict for these per-tensor distances (drop: whether the drop distance applies)."""
        d = max(distances) if distances else 0.0
        w = self.weights(distances)
        if self.per_push and w:
            w = [statistics.median(w)] * len(w)
        self.observe(distances)
        mean_d = sum(distances) / max(1, len(distances))
        if drop and self.drop is not None and d > self.drop:
            return Verdict(False, value_staleness=mean_d, reason=f"value distance {d:.3g} > {self.drop:g}")
        return Verdict(True, weights=tuple(w), value_staleness=mean_d)

    def _distances(self, push: Push) -> list[float]:
        return self.distances(push.values, push.sample_pos, push.sample) if push.sample is not None else []

    def admit(self, push: Push) -> Verdict:
        return self.judge_values(self._distances(push))

    def weigh(self, push: Push, verdict: Verdict) -> Verdict:
        v = self.judge_values(self._distances(push), drop=False)
        return verdict.but(weights=v.weights, value_staleness=v.value_staleness)

    def state_dict(self) -> dict:
        return {"recent": [list(r) for r in self.recent]}

    def load_state_dict(self, state: dict) -> None:
        self.recent = [deque(r, maxlen=RECENT) for r in state.get("recent", [])]
