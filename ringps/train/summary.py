"""Turn a run folder's per-rank rows into `metrics.jsonl` and `summary.json`.

The communication/waiting split: a worker of a synchronous step that finished its compute early
waits for the last one before the exchange can complete. All ranks of a run on one host share
the kernel's clock, so for each step `wait = latest t_ready of that step - own t_ready` (clipped
to the blocked time) and `comm = blocked - wait`. Strategies that know their waiting time (a
parameter server's reply says how long it was held) report it themselves.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import yaml

from ringps.record import rank_files, read_rows

SPIKE_FACTOR, SPIKE_WINDOW, SPIKE_FLOOR = 1.5, 20, 0.05
# a spike must also rise this fraction of the worker's starting loss above the recent median:
# near convergence the minibatch loss alone swings by more than 1.5x (a synchronous run, which
# averages every gradient, counted 20+ "spikes" with the absolute floor alone)
SPIKE_RELATIVE = 0.2
SETBACK_POINTS = 0.10  # a test accuracy this far below the best so far is a setback


def load_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in rank_files(run_dir):
        rows.extend(read_rows(f))
    return rows


def split_wait(steps: list[dict[str, Any]], synchronous: bool) -> None:
    """Fill comm_s and wait_s in place from exposed_s (see module docstring)."""
    latest: dict[int, float] = defaultdict(float)
    if synchronous:
        for r in steps:
            latest[r["step"]] = max(latest[r["step"]], r.get("t_ready") or 0.0)
    for r in steps:
        blocked = r.get("exposed_s") or 0.0
        if r.get("wait_s") is not None:
            wait = min(r["wait_s"], blocked)
        elif synchronous and r.get("t_ready"):
            wait = min(max(0.0, latest[r["step"]] - r["t_ready"]), blocked)
        else:
            wait = 0.0
        r["wait_s"], r["comm_s"] = wait, blocked - wait


def loss_spikes(losses: list) -> int:
    """Steps whose loss exceeds 1.5x the median of the previous 20 steps of the same worker, by at
    least max(0.05, 0.2 x the median of its first 20 steps): a jump that is large against the
    task's loss scale, not minibatch noise near zero. NaN and inf count too."""
    numbers = [x for x in losses[:SPIKE_WINDOW] if isinstance(x, (int, float))]
    floor = max(SPIKE_FLOOR, SPIKE_RELATIVE * statistics.median(numbers)) if numbers else SPIKE_FLOOR
    spikes = 0
    for i in range(SPIKE_WINDOW, len(losses)):
        window = [x for x in losses[i - SPIKE_WINDOW : i] if isinstance(x, (int, float))]
        if not isinstance(losses[i], (int, float)):
            spikes += 1  # NaN or inf
            continue
        if not window:
            continue
        med = statistics.median(window)
        if losses[i] > SPIKE_FACTOR * med and losses[i] > med + floor:
            spikes += 1
    return spikes


def accuracy_setbacks(accuracies: list[float]) -> int:
    """Times the test accuracy fell 10 points or more below its best so far (a collapse that
    builds up over several steps, which a per-step spike test does not see); counted once per fall."""
    best, down, setbacks = 0.0, False, 0
    for a in accuracies:
        if a <= best - SETBACK_POINTS:
            setbacks += 0 if down else 1
            down = True
        else:
            down = a < best - SETBACK_POINTS / 2 and down  # recovered once back near the best
        best = max(best, a)
    return setbacks


def host_kernel_per_step(by_worker: dict[int, list[dict[str, Any]]]) -> Optional[float]:
    rs = [r["host_kernel_cpu_s"] for r in by_worker.get(min(by_worker, default=0), [])
          if r.get("host_kernel_cpu_s") is not None]
    return sum(rs) / len(rs) if rs else None


def summarize(cfg: dict[str, Any], rows: list[dict[str, Any]], extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    extra = extra or {}
    steps = [r for r in rows if r["kind"] == "step"]
    evals = sorted((r for r in rows if r["kind"] == "eval"), key=lambda r: r["t"])
    split_wait(steps, extra.get("synchronous", True))
    by_worker: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in steps:
        by_worker[r["worker"]].append(r)
    per_worker = {}
    for w, rs in sorted(by_worker.items()):
        rs.sort(key=lambda r: r["step"])
        wall = max(rs[-1]["t"], 1e-9)
        compute = sum(r["compute_s"] for r in rs)
        ts = [r["t"] for r in rs]
        per_worker[str(w)] = {
            "steps": len(rs),
            "step_s_median": statistics.median(b - a for a, b in zip(ts, ts[1:])) if len(ts) > 1 else None,
            "wall_s": wall,
            "compute_s": compute,
            "cpu_s": sum(r.get("cpu_s") or 0.0 for r in rs),  # the process's CPU, threads and system calls
            "comm_s": sum(r["comm_s"] for r in rs),
            "wait_s": sum(r["wait_s"] for r in rs),
            "paused_s": sum(r.get("paused_s") or 0.0 for r in rs),  # held for another worker's evaluation (left out)
            "utilization": compute / wall,
            "bytes_sent": sum(r["bytes_sent"] for r in rs),
            "bytes_recv": sum(r["bytes_recv"] for r in rs),
            "loss_spikes": loss_spikes([r["loss"] for r in rs]),
            "final_loss": rs[-1]["loss"],
        }
    target = cfg["train"]["target_accuracy"]
    reached = next((r["t"] for r in evals if target is not None and r["accuracy"] >= target), None)
    pw = list(per_worker.values())
    n_steps = sum(p["steps"] for p in pw)
    losses = [r["loss"] for r in steps]
    return {
        "strategy": cfg["strategy"]["strategy"],
        "workers": cfg["run"]["workers"],
        "dataset": cfg["data"]["dataset"],
        "model": cfg["model"]["model"],
        "net": cfg["run"]["net"],
        "slowdown": cfg["run"]["slowdown"],
        "steps": max((p["steps"] for p in pw), default=0),
        "wall_s": max((p["wall_s"] for p in pw), default=0.0),
        "target_accuracy": target,
        "time_to_accuracy_s": reached,
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "best_accuracy": max((r["accuracy"] for r in evals), default=None),
        "utilization": statistics.mean(p["utilization"] for p in pw) if pw else None,
        "bytes_sent_per_step": sum(p["bytes_sent"] for p in pw) / n_steps if n_steps else None,
        "bytes_recv_per_step": sum(p["bytes_recv"] for p in pw) / n_steps if n_steps else None,
        "step_s_median": (statistics.median(p["step_s_median"] for p in pw if p["step_s_median"] is not None)
                          if any(p["step_s_median"] is not None for p in pw) else None),
        "compute_s_per_step": sum(p["compute_s"] for p in pw) / n_steps if n_steps else None,
        "cpu_s_per_step": sum(p["cpu_s"] for p in pw) / n_steps if n_steps else None,
        # the host's kernel CPU (system, irq, softirq) per step, over the first worker's steps: on
        # ringps's emulated cluster every process shares the one host, so this is the job's
        "host_kernel_cpu_s_per_step": host_kernel_per_step(by_worker),
        "comm_s_per_step": sum(p["comm_s"] for p in pw) / n_steps if n_steps else None,
        "wait_s_per_step": sum(p["wait_s"] for p in pw) / n_steps if n_steps else None,
        "loss_spikes": sum(p["loss_spikes"] for p in pw),
        "accuracy_setbacks": accuracy_setbacks([r["accuracy"] for r in evals]),
        "diverged": any(x is None or isinstance(x, str) for x in losses),
        "per_worker": per_worker,
        **{k: v for k, v in extra.items()},
    }


def finalize(run_dir: Path, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Merge rank rows into metrics.jsonl (time order) and write summary.json; returns the summary."""
    run_dir = Path(run_dir)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    rows = load_rows(run_dir)
    summary = summarize(cfg, rows, extra)
    stats = {f.name.split(".")[0]: yaml.safe_load(f.read_text()) for f in sorted((run_dir / "ranks").glob("*.summary.yaml"))}
    if stats:
        summary["strategy_stats"] = stats  # what each rank's strategy reported (exchanges, pushes...)
        from ringps.strategies import STRATEGIES

        summary.update(STRATEGIES.get(cfg["strategy"]["strategy"]).merge_summary(stats))
    rows.sort(key=lambda r: (r.get("wall") or 0.0, r.get("worker", -1)))
    with open(run_dir / "metrics.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.get("run", {}).get("tensorboard"):
        from ringps.train.tensorboard import write_tensorboard

        write_tensorboard(run_dir, rows)
    return summary


LAUNCHER_KEYS = ("synchronous", "launcher", "placement", "job_s", "failed_workers", "run_dir", "host_bytes")


def refresh_summary(run_dir: Path) -> dict[str, Any]:
    """Recompute summary.json of a finished run with this version's definitions (spikes, ...),
    keeping what only the launcher knew (placement, job time, failures)."""
    old = load_summary(run_dir)
    return finalize(run_dir, {k: old[k] for k in LAUNCHER_KEYS if k in old})


def load_summary(run_dir: Path) -> dict[str, Any]:
    p = Path(run_dir) / "summary.json"
    return json.loads(p.read_text())
