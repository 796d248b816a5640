"""What one training step of the job costs on this machine, measured before `--strategy auto`
chooses, when no calibration file prices the machine (`--auto-calibration`).

A shipped profile says what a model's layers cost on the machine and day that measured it, and
only the layers (facenet's, ringps/sim/profiles: the activations, pooling and loss between them
are not in it, 58% of its forward here), never the optimizer's step. A job's step here costs
~3x the shipped facenet profile: a choice priced on the profile alone takes a compute-bound job
for a communication-bound one and picks compression where 16-bit DDP is faster (docs/RESULTS.md
§6). So the job's own step is timed: the model, batch size, loss and optimizer it will train with,
in a process of its own (the workers' threads and allocator settings; the launcher's stay
untouched), on its real batches. It takes ~5 s (~15 s in 4 processes on 2 cores); its ratio to
the profile's compute prices every layer of the simulation.

Where the job's workers share this machine's cores, as many processes as will share them time the
step at once (a file barrier lines their timed steps up): 4 processes on 2 cores here compute a
step in 0.34-0.36 s, not the 0.28 s that one process's 0.14 s shared fairly gives (the cores'
caches and memory bandwidth are shared too), and a plan priced on one process alone predicted
the runs' times 0.69-0.95x (docs/RESULTS.md §6).

Those processes then time the step as a synchronous job's worker takes it: the model in DDP,
all-reducing over a gloo group of their own on loopback (a file store in the measurement's temp
folder, no port opened), its compute counted as `ringps train` counts it (forward, the backward
until DDP has its last bucket, the optimizer). It is the compute calibration fits from runs
(`sim.calibrate.fit_compute`): DDP's copies into its buckets and gloo's threads summing on the
cores the backward needs lengthen it, 0.38-0.43 s a step here against 0.31-0.38 s outside DDP
at 4 processes on 2 cores; priced on the compute outside DDP and the profile's split (which
leaves the optimizer out: more backward to hide the exchange behind) the plan's runs took
1.25-1.31x its prediction, priced so 1.06-1.13x (docs/RESULTS.md §6).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ringps.errors import RingpsError, first_line


@dataclass(frozen=True)
class StepCost:
    """Medians over the measured steps of `processes` processes computing at once on this
    machine (of each one's median), seconds."""

    compute_s: float  # forward, loss and backward
    optimizer_s: float  # the optimizer's step (a parameter server's worker leaves it to the servers)
    steps: int
    processes: int = 1
    # DDP's all-reduce among the processes on loopback (None: one process, or none time it): the
    # whole step, and its compute as `ringps train` counts it (forward, the backward until DDP has
    # its last bucket, gloo's threads working beside it, the optimizer), with those two's parts
    sync_step_s: Optional[float] = None
    sync_compute_s: Optional[float] = None
    sync_forward_s: Optional[float] = None
    sync_optimizer_s: Optional[float] = None

    @property
    def step_s(self) -> float:
        return self.compute_s + self.optimizer_s


def _barrier(folder: str, parties: int, deadline: float) -> None:
    """Wait until `parties` processes have arrived in `folder`, or `deadline` (time.time) has
    passed: then time the step anyway, less contended, rather than hang."""
    Path(folder, str(os.getpid())).touch()
    while len(os.listdir(folder)) < parties and time.time() < deadline:
        time.sleep(0.01)


def _measure(cfg_dict: dict[str, Any], steps: int, barrier: Any = None, group: Any = None) -> dict[str, float]:  # in the child
    import torch

    from ringps.config import validate
    from ringps.data import load_dataset
    from ringps.data.loader import ShardedLoader
    from ringps.malloc import keep_freed_memory
    from ringps.models import build_model
    from ringps.strategies.base import loss_of
    from ringps.train.trainer import build_optimizer

    cfg = validate(cfg_dict)
    torch.set_num_threads(cfg.run.threads)
    keep_freed_memory(cfg.run.malloc_keep_mb)
    data = load_dataset(cfg.data)
    torch.manual_seed(cfg.run.seed)
    model = build_model(cfg.model.model, data.shape, data.num_classes)
    loader = ShardedLoader(data.train, 0, cfg.run.workers, cfg.data.batch_size, cfg.run.seed,
                           augment=cfg.data.augment and data.augment)
    gpu = cfg.run.backend != "gloo" and torch.cuda.is_available()  # where the workers will compute
    device = torch.device("cuda:0" if gpu else "cpu")
    model.to(device).train()
    optimizer = build_optimizer(model.parameters(), cfg)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    if barrier:
        _barrier(*barrier)

    def timed(module: torch.nn.Module, ready: Any = None) -> list[tuple[float, float, float, float]]:
        """(forward, backward, exposed communication, optimizer) seconds of steps+1 steps, the
        first (which warms the allocator and caches up) dropped; `ready()`: when DDP handed its
        last bucket over (the backward's end, as `ringps train` counts it; the rest of
        backward() waits on the all-reduce)."""
        times: list[tuple[float, float, float, float]] = []
        batches = (b for epoch in range(1 << 30) for b in loader.epoch(epoch))
        while len(times) <= steps:
            batch = next(batches)
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=False)
            loss = loss_of(module, batch, device)
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            optimizer.step()
            sync()
            t3 = ready() if ready else t2
            times.append((t1 - t0, t3 - t1, t2 - t3, time.perf_counter() - t2))
        return times[1:]

    plain = timed(model)
    out = {"compute_s": statistics.median(f + b for f, b, _, _ in plain),
           "optimizer_s": statistics.median(o for *_, o in plain)}
    if group:  # the same step as a synchronous worker's: DDP all-reducing among the processes
        ddp = _in_ddp(model, cfg, group, timed)
        out.update(sync_step_s=statistics.median(sum(t) for t in ddp),
                   sync_compute_s=statistics.median(f + b + o for f, b, _, o in ddp),
                   sync_forward_s=statistics.median(f for f, *_ in ddp),
                   sync_optimizer_s=statistics.median(o for *_, o in ddp))
    return out


def _in_ddp(model: Any, cfg: Any, group: dict[str, Any], timed: Any) -> list[tuple[float, float, float, float]]:  # in the child
    """`timed` steps of the model in DDP over a gloo group of the measuring processes on loopback
    (a file store, no port), as `ringps train`'s DDP strategies wrap it; the group's waits end by
    the measurement's deadline."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ringps.comm.group import init_from_env, local_env
    from ringps.hooks import TimedHook

    # joined as ringps's local launcher has its ranks join: a file store, gloo's pairs on loopback
    os.environ.update(local_env(group["store"]), RANK=str(group["rank"]), WORLD_SIZE=str(group["world"]))
    init_from_env("gloo", max(1.0, group["deadline"] - time.time()))
    ddp = DDP(model, bucket_cap_mb=cfg.strategy.bucket_cap_mb, gradient_as_bucket_view=True)
    hook = TimedHook(default_hooks.allreduce_hook)  # the trainer's: when each bucket was handed over
    ddp.register_comm_hook(None, hook)
    times = timed(ddp, lambda: hook.last_ready)
    dist.barrier()  # every rank's collectives done before any leaves the group
    return times


def measure_step(cfg: Any, steps: int = 6, timeout: float = 120.0, processes: int = 1) -> StepCost:
    """The job's step on this machine (see the module's docstring), `processes` processes timing it
    at once; a RingpsError of one line when one fails or they take longer than `timeout` seconds
    (none is left running)."""
    with tempfile.TemporaryDirectory(prefix="ringps-measure-") as folder:
        arrived = Path(folder, "arrived")
        arrived.mkdir()
        # arrivals wait for the rest at most until half the time is up
        barrier = (str(arrived), processes, time.time() + timeout / 2) if processes > 1 else None
        # their DDP group's rendezvous (each process's rank is its argument), its waits bounded by the timeout
        group = {"store": str(Path(folder, "store")), "world": processes, "deadline": time.time() + timeout} if processes > 1 else None
        job = Path(folder, "job.json")
        job.write_text(json.dumps({"config": cfg.model_dump(mode="json"), "steps": steps, "barrier": barrier, "group": group}))
        procs = [subprocess.Popen([sys.executable, "-m", "ringps.launch.measure", str(job), str(r)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for r in range(processes)]
        end = time.time() + timeout
        try:
            done = [_wait(p, end) for p in procs]
        except subprocess.TimeoutExpired:
            raise RingpsError(f"--strategy auto: measuring {steps} steps of {cfg.model.model} on this machine took longer "
                              f"than {timeout:g}s; give --auto-calibration FILE, or name a strategy") from None
        finally:
            for p in procs:  # none outlives the measurement (the time is up, or one failed)
                if p.poll() is None:
                    p.kill()
                    p.communicate()
    outs = [_result(*d) for d in done]
    # every time the processes measured (a StepCost field each), the median over them
    return StepCost(steps=steps, processes=processes,
                    **{k: statistics.median(o[k] for o in outs) for k in outs[0] if all(k in o for o in outs)})


def _wait(p: subprocess.Popen, end: float) -> tuple[int, str, str]:
    out, err = p.communicate(timeout=max(0.0, end - time.time()))
    return p.returncode, out, err


def _result(returncode: int, stdout: str, stderr: str) -> dict[str, float]:
    """One measuring process's times, or the one-line error it ended with."""
    lines = stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if "error" in out:  # the job's own input (its data, its model): the error the job would have given
        err = RingpsError(out["error"])
        err.exit_code = out["exit_code"]
        raise err
    if returncode != 0 or "compute_s" not in out:
        why = (stderr.strip().splitlines() or [f"exit code {returncode}"])[-1]
        raise RingpsError(f"--strategy auto: measuring the job's step on this machine failed: {why}")
    return out


if __name__ == "__main__":  # python -m ringps.launch.measure JOB.json RANK ({"config": ..., "steps": N, "barrier": ..., "group": ...})
    req = json.loads(Path(sys.argv[1]).read_text())
    grp = req.get("group") and {**req["group"], "rank": int(sys.argv[2])}
    try:
        result = _measure(req["config"], req["steps"], req.get("barrier"), grp)
    except RingpsError as e:
        result = {"error": first_line(e), "exit_code": e.exit_code}
    print(json.dumps(result))
    # without the interpreter's teardown, which destroys gloo's threads in no set order and can
    # abort a process whose result is written (launch/worker.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
