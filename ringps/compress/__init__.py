"""Gradient selection with memory (docs/DESIGN.md "Selection with memory").

Order per tensor, GRACE-style: compensate (memory) -> select (selector) -> exchange (comm) ->
update memory (the unsent rest stays in the residual). Selectors and memories register by name.
"""

from ringps.registry import Registry

SELECTORS: Registry = Registry("selector")
MEMORIES: Registry = Registry("memory")

from ringps.compress import memory, selectors  # noqa: E402,F401  (registration)
from ringps.compress.memory import Memory  # noqa: E402
from ringps.compress.selectors import Selection, Selector  # noqa: E402
from ringps.compress.warmup import DensitySchedule  # noqa: E402

__all__ = ["SELECTORS", "MEMORIES", "Memory", "Selection", "Selector", "DensitySchedule"]
