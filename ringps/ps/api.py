"""The parameter server in your own training loop: `serve` on the server ranks, `RemoteOptimizer`
on the workers, in one job (torchrun, or any launcher that sets the env:// variables).

    dist.init_process_group("gloo")
    if is_server(servers=1):                      # the last `servers` ranks
        serve(model, policy="threshold", servers=1)
    else:
        opt = RemoteOptimizer(model, lr=0.05, policy="threshold", servers=1)
        ...  opt.zero_grad(); loss.backward(); opt.step()  ...
        opt.close()

Every rank builds the same model; rank 0's initial values are broadcast to all. `step()` pushes
the gradient to the servers and the reply's values land in the model's parameters; what the
policy made of the push (applied, staleness, weight) is in `opt.last`. Policy options are the
config keys of `ringps train` (`staleness_threshold=`, `vsgd_weight=`, ...). The servers run
momentum SGD with the optimizer's `momentum` and `weight_decay`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from ringps.config import validate
from ringps.ps import POLICIES
from ringps.ps.client import Client, PushResult
from ringps.ps.layout import Layout, flatten_into, gather
from ringps.ps.server import Server


def is_server(servers: int = 1) -> bool:
    """True on the last `servers` ranks of the job."""
    return dist.get_rank() >= dist.get_world_size() - servers


def _setup(model: nn.Module, policy: str, servers: int, momentum: float, weight_decay: float, timeout: float,
           options: dict[str, Any]):
    world = dist.get_world_size()
    if not 1 <= servers < world:
        raise ValueError(f"servers={servers}: a job of {world} ranks needs 1 to {world - 1} servers")
    workers = world - servers
    cfg = validate({"strategy": f"ps-{policy}", "workers": workers, "servers": servers, "momentum": momentum,
                    "weight_decay": weight_decay, "timeout": timeout, **options})
    for p in model.parameters():  # every rank starts from rank 0's values
        dist.broadcast(p.data, src=0)
    ranks = tuple(range(workers, world))
    return cfg, POLICIES.build(policy, cfg), Layout.of(model, servers), list(range(workers)), ranks


def serve(model: nn.Module, policy: str = "async", servers: int = 1, momentum: float = 0.9, weight_decay: float = 0.0,
          timeout: float = 120.0, **options: Any) -> dict[str, Any]:
    """Serve this rank's shard until every worker has closed; returns the server's statistics."""
    cfg, pol, layout, workers, ranks = _setup(model, policy, servers, momentum, weight_decay, timeout, options)
    index = ranks.index(dist.get_rank())
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    server = Server(dist.get_rank(), index, workers, layout, pol, gather(flat, layout, index),
                    pol.server_momentum, weight_decay, timeout, sample_seed=cfg.run.seed,
                    server_ranks=ranks)
    server.serve()
    return server.stats()


class RemoteOptimizer(torch.optim.Optimizer):
    """A worker's optimizer whose `step()` is a push-and-pull to the parameter servers.

    The parameters and their gradients become views into two flat buffers (so a push sends them
    without a copy); `zero_grad` zeroes the buffer instead of dropping the gradients."""

    def __init__(self, model: nn.Module, lr: float, policy: str = "async", servers: int = 1, momentum: float = 0.9,
                 weight_decay: float = 0.0, timeout: float = 120.0, **options: Any):
        super().__init__(model.parameters(), {"lr": lr})
        cfg, pol, layout, _, ranks = _setup(model, policy, servers, momentum, weight_decay, timeout, options)
        self.values, self.grads = flatten_into(model, layout)
        fraction = cfg.ps.vsgd_sample if pol.needs_sample else None
        self.client = Client(dist.get_rank(), ranks, layout, self.values, self.grads, timeout,
                             sample_fraction=fraction, sample_seed=cfg.run.seed)
        self.client.pull()
        self.steps = 0
        self.last: Optional[PushResult] = None

    def zero_grad(self, set_to_none: bool = False) -> None:
        self.grads.zero_()

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch.optim's signature
        loss = closure() if closure is not None else None
        self.steps += 1
        self.last = self.client.push_pull(self.param_groups[0]["lr"], self.steps)
        return loss

    def close(self) -> None:
        """Tell the servers this worker is done (they stop once every worker has)."""
        self.client.stop()
