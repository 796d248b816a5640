"""Shared test helpers: spawn N gloo ranks in fresh processes, each with a timeout; run the CLI in
this process (`cli_here`).

    results = run_ranks(fn, world=3, args=(...))   # fn(rank, world, *args) -> picklable value

A rank's exception fails the test with that rank's traceback; a rank that does not finish in
time is killed and the test fails naming it. No test ever waits forever.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import socket
import traceback
from datetime import timedelta
from typing import Any, Callable

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn: Callable, rank: int, world: int, port: int, args: tuple, q: mp.Queue, timeout: float) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        result = fn(rank, world, *args)
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, True, pickle.dumps(result)))  # plain pickle: no shared-memory handles
    except BaseException:  # noqa: BLE001
        q.put((rank, False, traceback.format_exc()))


def _context():
    """Ranks start from a fork server that imported torch once per session: a fresh process per
    rank (nothing leaks between tests) without each paying torch's ~4 s of imports on 2 cores."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed", "torch.optim", "ringps.strategies"])
    return ctx


def run_ranks(fn: Callable, world: int, args: tuple = (), timeout: float = 120.0) -> list[Any]:
    ctx = _context()
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args, q, timeout / 2), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            try:
                rank, ok, value = q.get(timeout=timeout)
            except Exception:
                missing = sorted(set(range(world)) - set(results))
                pytest.fail(f"ranks {missing} did not finish within {timeout}s")
            if not ok:
                pytest.fail(f"rank {rank} failed:\n{value}")
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]


def cli_here(capsys, *args: str) -> tuple[int, str]:
    """`ringps ARGS` run by its own `main` in this process: its exit code and what it wrote to
    stderr, without a fresh interpreter importing torch (~4 s each here). Keep a few cases as real
    processes too, for what only a process shows (warnings at import, the exit status)."""
    from ringps.cli.main import main

    capsys.readouterr()
    term = signal.getsignal(signal.SIGTERM)  # main makes SIGTERM clean up like Ctrl-C
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's errors
        code = e.code
    finally:
        signal.signal(signal.SIGTERM, term)
    return code, capsys.readouterr().err
