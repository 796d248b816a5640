"""PNG plots of runs: accuracy and loss against wall time, and each worker's time breakdown."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no screen needed
import matplotlib.pyplot as plt  # noqa: E402

from ringps.record import read_rows  # noqa: E402


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    f = Path(run_dir) / "metrics.jsonl"
    return list(read_rows(f)) if f.is_file() else []


def _labels(runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """The strategy names; the run folders' names where two runs share one (variants side by side)."""
    labels = [s.get("label") or s.get("strategy") or Path(d).name for d, s in runs]
    return labels if len(set(labels)) == len(labels) else [Path(d).name for d, _ in runs]


def plot_curves(runs: list[tuple[Path, dict[str, Any]]], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    fig_acc, ax_acc = plt.subplots(figsize=(7, 4.5))
    fig_loss, ax_loss = plt.subplots(figsize=(7, 4.5))
    for (run_dir, _), label in zip(runs, _labels(runs)):
        rows = _rows(run_dir)
        ev = sorted((r for r in rows if r["kind"] == "eval"), key=lambda r: r["t"])
        if ev:
            ax_acc.plot([r["t"] for r in ev], [100 * r["accuracy"] for r in ev], marker=".", label=label)
        # mean loss over workers per step, at the latest worker time of that step
        by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            if r["kind"] == "step" and isinstance(r.get("loss"), (int, float)):
                by_step[r["step"]].append(r)
        steps = sorted(by_step)
        ax_loss.plot([max(r["t"] for r in by_step[s]) for s in steps],
                     [sum(r["loss"] for r in by_step[s]) / len(by_step[s]) for s in steps], label=label, lw=1)
    target = next((s.get("target_accuracy") for _, s in runs if s.get("target_accuracy")), None)
    if target:
        ax_acc.axhline(100 * target, color="grey", ls="--", lw=0.8, label="target")
    for ax, fig, name, ylabel in ((ax_acc, fig_acc, "accuracy.png", "held-out accuracy (%)"),
                                  (ax_loss, fig_loss, "loss.png", "training loss (mean over workers)")):
        ax.set_xlabel("wall time (s, evaluation excluded)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(out / name)
    return written


def plot_breakdown(runs: list[tuple[Path, dict[str, Any]]], out: Path) -> Path:
    """Stacked bars: compute / communication / waiting seconds per worker, for each run."""
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(runs) * 2), 4.5))
    x, ticks, labels = 0.0, [], []
    colors = {"compute_s": "#4c72b0", "comm_s": "#dd8452", "wait_s": "#c44e52"}
    for (run_dir, s), name in zip(runs, _labels(runs)):
        for w, pw in sorted(s.get("per_worker", {}).items(), key=lambda kv: int(kv[0])):
            bottom = 0.0
            for key, color in colors.items():
                ax.bar(x, pw[key], bottom=bottom, color=color, width=0.8,
                       label=key.removesuffix("_s") if not ticks else None)
                bottom += pw[key]
            ticks.append(x)
            labels.append(f"{name}\nw{w}")
            x += 1
        x += 0.8
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("seconds")
    ax.set_title("time per worker")
    ax.legend()
    fig.tight_layout()
    path = out / "breakdown.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_runs(runs: list[tuple[Path, dict[str, Any]]], out: Path) -> list[Path]:
    from ringps.cli.timeline import plot_staleness, plot_timeline

    written = plot_curves(runs, out) + [plot_breakdown(runs, out)]
    for run_dir, _ in runs:
        written += plot_timeline(run_dir, out) + plot_staleness(run_dir, _rows(run_dir), out)
    return written
