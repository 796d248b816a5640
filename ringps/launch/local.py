"""The local launcher: start every rank of a job as a process on this machine and watch them.

Each rank gets torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) and runs
`python -m ringps.launch.worker`; a `Placement` decides where (loopback, or one network namespace
per host for `--net`). The launcher shows progress from worker 0's rows and enforces:
- a synchronous job whose rank fails is stopped at once, and the error names that rank;
- an asynchronous job (parameter server) carries on without a dead worker, not a dead server;
- no progress for longer than --timeout (+ a margin) stops the job, naming the silent ranks;
- Ctrl-C, SIGTERM and every failure terminate all ranks (they also die with the launcher).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ringps.comm.group import local_env
from ringps.config import Config
from ringps.errors import CommTimeout, WorkerFailed
from ringps.launch.progress import ProgressView
from ringps.strategies import STRATEGIES

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 3.0  # after SIGTERM, before SIGKILL
COLLECT_S = 1.0  # after a first failure, to see which other ranks fail with it
WATCHDOG_MARGIN_S = 60.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Placement:
    """Where each rank runs: a command prefix (e.g. `ip netns exec NS`) and extra environment."""

    master_addr: str = "127.0.0.1"
    prefixes: dict[int, list[str]] = field(default_factory=dict)
    envs: dict[int, dict[str, str]] = field(default_factory=dict)
    description: str = "loopback"
    counters: Optional[Callable[[], list[dict[str, int]]]] = None  # per-host interface byte counters


@dataclass
class JobResult:
    failed: dict[int, str]  # rank -> one-line reason, for ranks that died without stopping the job
    job_s: float


class Job:
    def __init__(self, cfg: Config, run_dir: Path, placement: Optional[Placement] = None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.placement = placement or Placement()
        self.strategy_cls = STRATEGIES.get(cfg.strategy.strategy)
        servers = cfg.run.servers if self.strategy_cls.needs_servers else 0
        self.workers, self.world = cfg.run.workers, cfg.run.workers + servers
        self.procs: dict[int, subprocess.Popen] = {}
        self.logs: list[Any] = []

    def is_worker(self, rank: int) -> bool:
        return rank < self.workers

    def start(self) -> None:
        port = free_port()  # in an emulated cluster every port of host 0 is free anyway
        logs = self.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        for rank in range(self.world):
            env = dict(os.environ)
            env.update(
                RANK=str(rank), WORLD_SIZE=str(self.world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(self.world),
                MASTER_ADDR=self.placement.master_addr, MASTER_PORT=str(port),
                OMP_NUM_THREADS=str(self.cfg.run.threads), PYTHONUNBUFFERED="1", RINGPS_LAUNCHED="1",
            )
            if not self.placement.prefixes:  # all on loopback: a file store, nothing listens beyond it
                env.update(local_env(str((self.run_dir / "logs" / "rendezvous.store").resolve())))
            env.update(self.placement.envs.get(rank, {}))
            cmd = self.placement.prefixes.get(rank, []) + [sys.executable, "-m", "ringps.launch.worker", "--run-dir", str(self.run_dir)]
            log = open(logs / f"rank{rank}.log", "w")
            self.logs.append(log)
            self.procs[rank] = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent,
            )

    # -- failure reports ---------------------------------------------------------------
    def reason(self, rank: int, code: int) -> str:
        err = self.run_dir / "ranks" / f"rank{rank}.error"
        if err.is_file():
            return err.read_text().strip()
        if code < 0:
            return f"rank {rank}: killed by signal {signal.Signals(-code).name}"
        return f"rank {rank}: exited with code {code} (see {self.run_dir}/logs/rank{rank}.log)"

    @staticmethod
    def primary(reasons: dict[int, str]) -> int:
        """The rank that failed first in cause: a killed rank, then a rank with its own error,
        before the ranks that only lost their connection to it."""
        def order(rank: int) -> tuple[int, int]:
            text = reasons[rank]
            if "killed by signal" in text:
                return (0, rank)
            if "lost the connection" in text or "timed out" in text:
                return (2, rank)
            return (1, rank)
        return min(reasons, key=order)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in self.logs:
            log.close()
        # every rank has ended: the rendezvous file goes too (torch's FileStore deletes it when its
        # last user closes it, which a rank ended by os._exit, launch/worker.py, or a signal never does)
        (self.run_dir / "logs" / "rendezvous.store").unlink(missing_ok=True)

    def activity(self) -> int:
        """Grows whenever any rank writes a row: what the watchdog calls progress."""
        return sum(f.stat().st_size for f in (self.run_dir / "ranks").glob("*.jsonl"))

    # -- the watch loop ------------------------------------------------------------------
    def wait(self, view: Optional[ProgressView] = None) -> JobResult:
        t0 = time.monotonic()
        failed: dict[int, str] = {}
        last_progress, last_activity = time.monotonic(), -1
        synchronous = self.strategy_cls.synchronous
        try:
            while True:
                done = {r: p.poll() for r, p in self.procs.items()}
                for r, code in done.items():
                    if code not in (None, 0) and r not in failed:
                        failed[r] = self.reason(r, code)
                fatal = [r for r in failed if synchronous or not self.is_worker(r)]
                if fatal or all(r in failed for r in range(self.workers)):  # a server, or every worker
                    time.sleep(COLLECT_S)  # let the ranks that fail with it report too
                    for r, p in self.procs.items():
                        if r not in failed and p.poll() not in (None, 0):
                            failed[r] = self.reason(r, p.returncode)
                    first = self.primary(failed)
                    others = sorted(set(failed) - {first})
                    tail = f"; ranks {', '.join(map(str, others))} stopped after it" if others else ""
                    raise WorkerFailed(f"{failed[first]}{tail}. Logs: {self.run_dir}/logs/")
                for r in failed:
                    if view is not None:
                        view.note_failure(r, failed[r])
                if all(code is not None for code in done.values()):
                    return JobResult(failed, time.monotonic() - t0)
                if view is not None:
                    view.update()
                activity = self.activity()
                if activity != last_activity:
                    last_activity, last_progress = activity, time.monotonic()
                silent = time.monotonic() - last_progress
                if silent > self.cfg.run.timeout + WATCHDOG_MARGIN_S:
                    alive = [r for r, c in done.items() if c is None]
                    raise CommTimeout(
                        f"no progress for {silent:.0f}s (--timeout {self.cfg.run.timeout:g}); "
                        f"ranks still running: {', '.join(map(str, alive))}. Logs: {self.run_dir}/logs/"
                    )
                time.sleep(0.2)
        finally:
            self.stop()
