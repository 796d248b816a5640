"""`--strategy auto` under torchrun: the job's ranks choose together, once their group exists.

Locally the launcher chooses before any worker starts (`run.resolve_auto`), on this machine's
emulated cluster. Under torchrun each rank starts alone on its own host and would choose alone,
on its own timing, so the ranks could disagree. Here the choice waits for the group:

1. every rank takes part in measuring the links (a ring all-reduce's latency and bandwidth,
   `comm.probe.measure_links`: max-reduced, the same answer everywhere);
2. rank 0 times the job's step on its host (`launch.measure`; or a calibration file prices it,
   `--auto-calibration`) and ranks every candidate on that cluster: WORLD_SIZE workers over
   WORLD_SIZE / LOCAL_WORLD_SIZE hosts of rank 0's kind, a device each on CUDA, the host's cores
   shared by its processes on CPU, the links as measured (a flat ring at the group's rate);
3. rank 0 broadcasts the pick (or its one-line error) and every rank trains the same config;
   rank 0 writes the plan into the run folder (auto-plan.json).

A parameter-server pick takes the last --servers ranks as servers, as a named ps-* job does;
on NCCL only the collective strategies are ranked (a parameter server's ranks talk gloo).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from ringps.config import Config
from ringps.errors import GroupFailure, RingpsError, first_line


def group_cluster(cfg: Config, links: tuple[float, float], nodes: int, gpu: bool, fitted: Any, ps: bool = False):
    """The torchrun job's cluster as the simulator sees it: cfg.run.workers ranks (the servers
    among them for `ps`), links at the group's measured all-reduce rate (payload: efficiency 1)."""
    from ringps.cost import cores
    from ringps.sim.cluster import ClusterSpec

    latency, bandwidth = links
    servers = cfg.run.servers if ps else 0
    rate = f"{min(bandwidth, 1e12) * 8 / 1e6:.6g}mbit"  # one rank alone measures no link: any rate
    a = fitted.ps_compute_a if ps and fitted.ps_compute_a else fitted.compute_a
    return ClusterSpec(workers=max(1, cfg.run.workers - servers), net=rate, latency_s=latency, efficiency=1.0,
                       servers=max(1, servers), slowdown=cfg.run.slowdown, compute_scale=a, jitter=fitted.jitter,
                       shared_cores=None if gpu else cores() * nodes,
                       forward_share=None if ps else fitted.forward_share,
                       optimizer_share=None if ps else fitted.optimizer_share,
                       sync_wait_s=0.0 if ps else fitted.sync_wait_s)


def _choose(cfg: Config, links: tuple[float, float], nodes: int, gpu: bool) -> tuple[Config, dict]:
    """Rank 0's choice: the picked config and the plan."""
    from ringps.launch.run import auto_choices, auto_plan

    picked, plan = auto_plan(cfg, *auto_choices(cfg, links=links, nodes=nodes, gpu=gpu))
    plan["links"] = {"latency_s": links[0], "bandwidth_bytes_s": links[1], "measured": "ring all-reduce over the group"}
    return picked, plan


def resolve_in_group(cfg: Config, rank: int, world: int, device: torch.device) -> tuple[Config, Optional[dict[str, Any]]]:
    """--strategy auto once torchrun's group exists: (the config every rank trains, rank 0's plan;
    None elsewhere). A failure on rank 0 (its step, its calibration file) reaches every rank as
    the same one-line error."""
    from ringps.comm.probe import broadcast_object, measure_links

    links = measure_links(None, device=device)
    nodes = max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    box: Any = None
    failed: Optional[BaseException] = None
    if rank == 0:
        try:
            box = _choose(cfg.model_copy(update={"run": cfg.run.model_copy(update={"workers": world})}),
                          links, nodes, device.type == "cuda")
        except Exception as e:  # noqa: BLE001 - the others learn of it, rank 0 raises it as it was
            failed = e
            box = first_line(e) if isinstance(e, RingpsError) else f"{type(e).__name__}: {first_line(e)}"
    box = broadcast_object(box)  # the others wait here for rank 0's choice, within the group's timeout
    if failed is not None:
        raise GroupFailure(box) from failed  # the line it would have said; the traceback keeps the cause
    if isinstance(box, str):
        raise GroupFailure(f"rank 0 could not choose for --strategy auto: {box}")
    picked, plan = box  # a validated Config: every rank trains rank 0's object as it was picked
    return picked, (plan if rank == 0 else None)
