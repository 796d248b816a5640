"""Public DDP communication hooks for users' own DDP loops, and wrappers that make hooks safe.

    from ringps.hooks import RingTopkState, ring_topk_hook
    ddp.register_comm_hook(RingTopkState(density=0.01).bind(model), ring_topk_hook)

    from ringps.hooks import OrderedHook       # any hook, collectives in one order on every rank
    ddp.register_comm_hook(state, OrderedHook(powerSGD_hook))
"""

from ringps.hooks.ordered import OrderedHook, TimedHook
from ringps.hooks.ring_topk import RingTopkState, ring_topk_hook

__all__ = ["OrderedHook", "TimedHook", "RingTopkState", "ring_topk_hook"]
