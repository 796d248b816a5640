"""ring-topk inside PyTorch Lightning: `Trainer(strategy=RingTopkStrategy(density=0.01))`.

Lightning's `DDPStrategy` registers a `ddp_comm_hook` only when the device is CUDA, so on CPU a
hook given to it is silently never registered. `RingTopkStrategy` registers the hook on CPU and
GPU alike, keys its memories by the module's parameter names, and puts every rank's residuals
into the checkpoint (Lightning writes rank 0's only): on resume each rank takes its own part.
With `exact_tail=` it takes the run's length from the trainer (`estimated_stepping_batches`).

    pip install ringps[lightning]
    trainer = lightning.Trainer(accelerator="cpu", devices=4, strategy=RingTopkStrategy(density=0.01))
"""

from __future__ import annotations

import math
from typing import Any, Optional

from lightning.pytorch.strategies import DDPStrategy

from ringps.hooks import RingTopkState, ring_topk_hook

CHECKPOINT_KEY = "ringps_ring_topk"


class RingTopkStrategy(DDPStrategy):
    strategy_name = "ringps_ring_topk"

    def __init__(self, state: Optional[RingTopkState] = None, ddp_kwargs: Optional[dict] = None, **state_kwargs: Any):
        """`state`, or RingTopkState's keyword arguments (density=, exchange=, memory=, ...);
        `ddp_kwargs` go to Lightning's DDPStrategy."""
        if state is not None and state_kwargs:
            raise ValueError("give a RingTopkState or its keyword arguments, not both")
        self.hook_state = state or RingTopkState(**state_kwargs)
        super().__init__(**(ddp_kwargs or {}))

    def _register_ddp_hooks(self) -> None:
        self.hook_state.bind(self.model.module)
        self.model.register_comm_hook(self.hook_state, ring_topk_hook)

    def on_train_start(self) -> None:
        # the exact tail needs the run's length, which Lightning knows once training starts
        if self.hook_state.exact_tail > 0 and self.hook_state.tail_from is None:
            steps = self.lightning_module.trainer.estimated_stepping_batches
            if math.isfinite(steps):
                self.hook_state.set_total_steps(int(steps))
        super().on_train_start()

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options: Optional[Any] = None) -> None:
        # every rank calls this; all take part in gathering the residuals, rank 0 writes them
        checkpoint[CHECKPOINT_KEY] = self.hook_state.state_dict(all_ranks=True)
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path, *args: Any, **kwargs: Any) -> dict:
        checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
        if CHECKPOINT_KEY in checkpoint:
            self.hook_state.load_state_dict(checkpoint[CHECKPOINT_KEY])
        return checkpoint

    def teardown(self) -> None:
        self.hook_state.close()
        super().teardown()
