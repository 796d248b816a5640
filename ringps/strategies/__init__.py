"""Training strategies by name. Each registers itself with `@STRATEGIES.register(name)`."""

from ringps.strategies import ddp, local, ps, ring_topk  # noqa: E402,F401  (registration)
from ringps.strategies.base import STRATEGIES, StepStats, Strategy, WorkerContext

__all__ = ["STRATEGIES", "StepStats", "Strategy", "WorkerContext"]
