"""The entry of one ringps process, under the local launcher or under torchrun.

It reads the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT),
joins the process group (env:// rendezvous, nothing home-made), builds data, model and strategy,
and runs the Trainer (worker ranks) or the strategy's server loop (server ranks: the last S
ranks). Any failure becomes one line in `RUN/ranks/rankR.error` naming the rank, the step and
the cause; the full traceback goes to the rank's log.

    torchrun --nproc-per-node 4 -m ringps train --strategy allreduce      # one node
    python -m ringps.launch.worker --run-dir runs/NAME                    # what `ringps train` spawns
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
import yaml

from ringps import trace
from ringps.comm.group import init_from_env
from ringps.config import Config, validate
from ringps.data import load_dataset
from ringps.data.loader import steps_per_epoch
from ringps.errors import GroupFailure, RingpsError, first_line
from ringps.malloc import keep_freed_memory
from ringps.models import build_model
from ringps.strategies import STRATEGIES, WorkerContext
from ringps.strategies.base import Stretch
from ringps.train.trainer import Trainer

DONE_KEY = "ringps/done"
SAID_KEY = "ringps/failure-said"


def roles(cfg: Config, world: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(worker ranks, server ranks): workers first, then the servers of ps-* strategies."""
    servers = cfg.run.servers if STRATEGIES.get(cfg.strategy.strategy).needs_servers else 0
    if world - servers < 1:
        raise RingpsError(f"WORLD_SIZE {world} leaves no worker beside {servers} server(s)")
    return tuple(range(world - servers)), tuple(range(world - servers, world))


def pick_backend(cfg: Config) -> str:
    """auto: NCCL where CUDA is, but gloo for a parameter-server job (its tagged point-to-point
    and any-source receives are gloo's, on CPU buffers), whose workers then compute on the CPU."""
    if cfg.run.backend != "auto":
        return cfg.run.backend
    if cfg.strategy.strategy != "auto" and STRATEGIES.get(cfg.strategy.strategy).needs_servers:
        return "gloo"
    return "nccl" if torch.cuda.is_available() else "gloo"


def describe(e: BaseException, rank: int, phase: Optional[str], timeout: float) -> str:
    """One line for the user: which rank, where, and what went wrong."""
    where = f"rank {rank}" + (f" during {phase}" if phase else "")
    text = first_line(e)
    if isinstance(e, RingpsError):
        return f"{where}: {text}"
    low = text.lower()
    if "timed out" in low or "timeout" in low:
        return f"{where}: timed out after {timeout:g}s waiting for another rank ({text})"
    if "connection closed" in low or "connection reset" in low or "broken pipe" in low:
        return f"{where}: lost the connection to another rank ({text})"
    return f"{where}: {type(e).__name__}: {text}"


def run_process(cfg: Config, run_dir: Optional[Path], managed: bool) -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.set_num_threads(cfg.run.threads)
    keep_freed_memory(cfg.run.malloc_keep_mb)
    backend = pick_backend(cfg)
    device = torch.device(f"cuda:{local_rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    trainer: Optional[Trainer] = None
    try:
        init_from_env(backend, cfg.run.timeout)
        plan = None
        if not managed and cfg.strategy.strategy == "auto":  # chosen together (auto_group.py), then checked
            from ringps.launch.auto_group import resolve_in_group
            from ringps.launch.run import check

            cfg, plan = resolve_in_group(cfg, rank, world, device)
            check(cfg)
        worker_ranks, server_ranks = roles(cfg, world)
        if not managed:  # torchrun decides the size; rank 0 names the run folder for everyone
            cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"workers": len(worker_ranks)})})
            run_dir = shared_run_dir(cfg, rank)
            if plan is not None:
                from ringps.launch.run import write_plan

                write_plan(run_dir, plan, cfg)
        assert run_dir is not None
        if cfg.run.trace:
            tracer = trace.install(trace.Tracer(run_dir, rank, world, backend, "worker" if rank in worker_ranks else "server"))
            dist.barrier()  # every rank's lanes count from the moment they all left this barrier
            tracer.align(time.perf_counter())
        group = dist.new_group(list(worker_ranks), timeout=timedelta(seconds=cfg.run.timeout)) if server_ranks else None
        data = load_dataset(cfg.data)
        torch.manual_seed(cfg.run.seed)  # identical initial model on every rank
        model = build_model(cfg.model.model, data.shape, data.num_classes).to(device)
        is_worker = rank in worker_ranks
        worker = worker_ranks.index(rank) if is_worker else -1
        slow = cfg.run.slowdown[worker] if (cfg.run.slowdown and is_worker) else 1.0
        ctx = WorkerContext(
            rank=rank, world_size=world, worker=worker, workers=len(worker_ranks), group=group,
            device=device, backend=backend, timeout=cfg.run.timeout, cfg=cfg, out_dir=run_dir,
            stretch=Stretch(slow), server_ranks=server_ranks, worker_ranks=worker_ranks,
        )
        ctx.steps_per_epoch = steps_per_epoch(len(data.train.labels), len(worker_ranks), cfg.data.batch_size)
        torch.manual_seed(cfg.run.seed * 1000 + rank)  # per-rank randomness (dropout) from here on
        strategy = STRATEGIES.build(cfg.strategy.strategy, cfg)
        if is_worker:
            trainer = Trainer(cfg, ctx, strategy, data, model)
            trainer.run()
        else:
            strategy.serve(ctx, model)
        trace.get().write()
        finish(cfg, run_dir, rank, world, managed, strategy)
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure leaves one line and a traceback
        if isinstance(e, KeyboardInterrupt):
            return 130
        line = describe(e, rank, trainer.where if trainer else None, cfg.run.timeout)
        traceback.print_exc()
        print(f"ringps: {line}", file=sys.stderr, flush=True)
        if run_dir is not None:
            (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
            (run_dir / "ranks" / f"rank{rank}.error").write_text(line + "\n")
            trace.get().write()  # what happened up to the failure
        if isinstance(e, GroupFailure) and not managed:
            wait_until_all_said(rank, world, min(cfg.run.timeout, 30.0))
        return 1


def arrive(key: str, rank: int, world: int, timeout: float, poll: float) -> None:
    """Count this rank in at `key` of the group's store; rank 0, which hosts the store and whose
    exit takes it (and, under torchrun, the other ranks) away, waits until all `world` have, at
    most `timeout` seconds."""
    store = dist.distributed_c10d._get_default_store()
    store.add(key, 1)
    deadline = time.monotonic() + timeout
    while rank == 0 and store.add(key, 0) < world and time.monotonic() < deadline:
        time.sleep(poll)


def wait_until_all_said(rank: int, world: int, timeout: float) -> None:
    """After a failure every rank shares: count this rank's line as said; rank 0 waits (a bounded
    while) for every rank's. Under torchrun rank 0's exit makes the agent stop the others, which
    may not have received the broadcast failure yet, let alone printed it."""
    try:
        arrive(SAID_KEY, rank, world, timeout, poll=0.05)
    except Exception:  # noqa: BLE001 - best effort: the failure itself is already said
        pass


def shared_run_dir(cfg: Config, rank: int) -> Path:
    from ringps.launch.rundir import create_run_dir

    obj = [None]
    if rank == 0:
        obj[0] = str(create_run_dir(cfg))
    dist.broadcast_object_list(obj, src=0)
    return Path(obj[0])  # type: ignore[arg-type]


def finish(cfg: Config, run_dir: Path, rank: int, world: int, managed: bool, strategy) -> None:
    """Write this rank's strategy figures; under torchrun, tell the others this rank is done, and
    rank 0 (which hosts the store) waits for all of them, then writes the summary. Under the local
    launcher the launcher waits for every process and writes the summary: no rank touches the
    store here, since rank 0 may already have exited and taken the store with it."""
    from ringps.train.summary import finalize

    extra = strategy.summary()
    if extra:
        (run_dir / "ranks" / f"rank{rank}.summary.yaml").write_text(yaml.safe_dump(extra))
    if not managed:
        arrive(DONE_KEY, rank, world, cfg.run.timeout, poll=0.2)
        if rank == 0:
            finalize(run_dir, {"synchronous": strategy.synchronous, "launcher": "torchrun"})
    dist.destroy_process_group()


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description="one ringps process (spawned by `ringps train`)")
    p.add_argument("--run-dir", required=True)
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    cfg = validate(yaml.safe_load((run_dir / "config.yaml").read_text()))
    return run_process(cfg, run_dir, managed=True)


if __name__ == "__main__":
    rc = main()
    # Everything this process owes is written and closed by now (records, trace, summary). End
    # without the interpreter's teardown: it destroys C++ objects of torch.distributed (gloo's
    # threads, the TCPStore rank 0 hosts) in no set order, and a thread destroyed while still
    # joinable aborts the process ("terminate called without an active exception", SIGABRT),
    # which the launcher rightly reports as a failed rank, after a run that succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
