"""Run a module as N ranks (torchrun's environment, a Placement each) and collect one JSON line
from each rank's stdout. For measurements (`ringps bench`), not training jobs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ringps.comm.group import local_env
from ringps.errors import CommTimeout, WorkerFailed
from ringps.launch.local import Placement, free_port


def run_module(module: str, args: list[str], world: int, placement: Placement | None = None,
               timeout: float = 600.0, threads: int = 1) -> list[dict]:
    placement = placement or Placement()
    port = free_port()
    store = Path(tempfile.mkdtemp(prefix="ringps-store-")) / "rendezvous.store"
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": placement.master_addr, "MASTER_PORT": str(port), "OMP_NUM_THREADS": str(threads),
               "RINGPS_LAUNCHED": "1", **({} if placement.prefixes else local_env(str(store))),
               **placement.envs.get(rank, {})}
        cmd = placement.prefixes.get(rank, []) + [sys.executable, "-m", module, *args]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    outs: list[dict] = []
    try:
        for rank, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise CommTimeout(f"rank {rank} of `{module}` did not finish within {timeout:.0f}s") from None
            if p.returncode != 0:
                last = (err or out).strip().splitlines()[-1:] or ["no output"]
                raise WorkerFailed(f"rank {rank} of `{module}` failed: {last[0]}")
            lines = [l for l in out.splitlines() if l.startswith("{")]
            outs.append(json.loads(lines[-1]) if lines else {})
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(store.parent, ignore_errors=True)
    return outs
