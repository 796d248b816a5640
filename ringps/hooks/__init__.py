"""Public DDP communication hooks for users' own DDP loops, and wrappers that make hooks safe.

    from ringps.hooks import OrderedHook
    ddp.register_comm_hook(state, OrderedHook(powerSGD_hook))
"""

from ringps.hooks.ordered import OrderedHook, TimedHook

__all__ = ["OrderedHook", "TimedHook"]
