"""What one training step of the job costs on this machine, measured before `--strategy auto`
chooses, when no calibration file prices the machine (`--auto-calibration`).

A shipped profile says what a model's layers cost on the machine and day that measured it, and
only the layers (facenet's, ringps/sim/profiles: the activations, pooling and loss between them
are not in it, 58% of its forward here), never the optimizer's step. A job's step here costs
~3x the shipped facenet profile: a choice priced on the profile alone takes a compute-bound job
for a communication-bound one and picks compression where 16-bit DDP is faster (docs/RESULTS.md
§6). So the job's own step is timed: the model, batch size, loss and optimizer it will train with,
in a process of its own (the workers' threads and allocator settings; the launcher's stay
untouched), on its real batches. It takes ~8 s; its ratio to the profile's compute prices every
layer of the simulation.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from ringps.errors import RingpsError, first_line


@dataclass(frozen=True)
class StepCost:
    """Medians over the measured steps of one process alone on this machine, seconds."""

    compute_s: float  # forward, loss and backward
    optimizer_s: float  # the optimizer's step (a parameter server's worker leaves it to the servers)
    steps: int

    @property
    def step_s(self) -> float:
        return self.compute_s + self.optimizer_s


def _measure(cfg_dict: dict[str, Any], steps: int) -> tuple[float, float]:  # in the child process
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
    times: list[tuple[float, float]] = []
    epoch = 0
    while len(times) <= steps:  # the first step warms the allocator and caches up: dropped
        for batch in loader.epoch(epoch):
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=False)
            loss_of(model, batch, device).backward()
            sync()
            t1 = time.perf_counter()
            optimizer.step()
            sync()
            times.append((t1 - t0, time.perf_counter() - t1))
            if len(times) > steps:
                break
        epoch += 1
    return statistics.median(a for a, _ in times[1:]), statistics.median(b for _, b in times[1:])


def measure_step(cfg: Any, steps: int = 6, timeout: float = 120.0) -> StepCost:
    """The job's step on this machine (see the module's docstring), in a process of its own; a
    RingpsError of one line when that process fails or takes longer than `timeout` seconds."""
    job = json.dumps({"config": cfg.model_dump(mode="json"), "steps": steps})
    try:
        done = subprocess.run([sys.executable, "-m", "ringps.launch.measure"], input=job, capture_output=True,
                              text=True, timeout=timeout)  # killed when the time is up
    except subprocess.TimeoutExpired:
        raise RingpsError(f"--strategy auto: measuring {steps} steps of {cfg.model.model} on this machine took longer "
                          f"than {timeout:g}s; give --auto-calibration FILE, or name a strategy") from None
    lines = done.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if "error" in out:  # the job's own input (its data, its model): the error the job would have given
        err = RingpsError(out["error"])
        err.exit_code = out["exit_code"]
        raise err
    if done.returncode != 0 or "compute_s" not in out:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise RingpsError(f"--strategy auto: measuring the job's step on this machine failed: {why}")
    return StepCost(compute_s=out["compute_s"], optimizer_s=out["optimizer_s"], steps=steps)


if __name__ == "__main__":  # python -m ringps.launch.measure < {"config": ..., "steps": N}
    req = json.loads(sys.stdin.read())
    try:
        c, o = _measure(req["config"], req["steps"])
    except RingpsError as e:
        print(json.dumps({"error": first_line(e), "exit_code": e.exit_code}))
    else:
        print(json.dumps({"compute_s": c, "optimizer_s": o}))
