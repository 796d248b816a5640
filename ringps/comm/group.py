"""Joining the job's process group from the environment the launcher gave.

torchrun (and the multi-machine path) rendezvous with env:// (MASTER_ADDR/PORT: rank 0's TCP
store). ringps's own local launcher and bench runs set RINGPS_INIT_METHOD=file://... instead: a
file store in the run folder, so a job that never leaves the machine opens no TCP listener (a
TCP store listens on every interface), and GLOO_SOCKET_IFNAME=lo keeps gloo's pairs on loopback.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as dist

INIT_METHOD = "RINGPS_INIT_METHOD"


def init_from_env(backend: str, timeout: float) -> None:
    method = os.environ.get(INIT_METHOD)
    if method:
        dist.init_process_group(backend, init_method=method, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=timeout))
    else:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))


def local_env(store_file: str) -> dict[str, str]:
    """What a launcher on loopback adds to each rank's environment."""
    return {INIT_METHOD: f"file://{store_file}", "GLOO_SOCKET_IFNAME": "lo"}
