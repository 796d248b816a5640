"""Density warm-up (DGC): start dense-ish and tighten exponentially to the final density.

With final density d and W warm-up steps, the density at step s < W is 0.25 * (d / 0.25) ** (s / W):
DGC's 0.25 -> 0.0625 -> 0.015 -> ... as a smooth curve that reaches d at step W.
"""

from __future__ import annotations


class DensitySchedule:
    def __init__(self, final: float, warmup_steps: int = 0, start: float = 0.25):
        self.final, self.warmup_steps = final, warmup_steps
        self.start = max(start, final)

    def __call__(self, step: int) -> float:
        if self.warmup_steps <= 0 or step >= self.warmup_steps:
            return self.final
        return self.start * (self.final / self.start) ** (step / self.warmup_steps)

    def k(self, numel: int, step: int) -> int:
        """Entries to send from a tensor of `numel` at `step` (at least 1 while density > 0)."""
        d = self(step)
        return 0 if d <= 0 else min(numel, max(1, int(round(d * numel))))
