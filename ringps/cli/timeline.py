"""What a run's traces show: `timeline.png` (a few steps of every rank, one lane per rank and
thread, spans coloured by kind; a parameter-server run's server lanes with pushes coloured
applied or dropped), `staleness.png` for parameter-server runs, and the per-rank breakdown of
`ringps report --breakdown` (compute, exposed communication, evaluation, idle), from the traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ringps.trace import load  # noqa: E402

COLOURS = {"compute": "#4c72b0", "slowdown": "#a6bddb", "comm": "#dd8452", "eval": "#8c8c8c",
           "applied": "#55a868", "dropped": "#c44e52", "server": "#937860"}


def traces(run_dir: Path) -> dict[int, dict]:
    return {int(f.stem.split("-")[1]): load(f) for f in sorted((Path(run_dir) / "trace").glob("rank-*.json"))}


def kind(ev: dict) -> str:
    if ev["name"] == "slowdown":
        return "slowdown"
    if ev.get("cat") == "server":
        verdict = (ev.get("args") or {}).get("verdict")
        return verdict if verdict in ("applied", "dropped") else "server"
    return ev.get("cat", "compute") if ev.get("cat") in COLOURS else "compute"


def spans(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def breakdown(run_dir: Path) -> dict[int, dict[str, float]]:
    """Per rank, seconds of compute, exposed communication, evaluation and idle on the main lane
    (or, for a server, busy and idle over its worker lanes), from the first span to the last."""
    out = {}
    for rank, doc in traces(run_dir).items():
        lanes = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
        main = [e for e in spans(doc) if lanes.get(e["tid"]) == "main"]
        if not main:  # a server: how busy its handlers were
            ev = spans(doc)
            if not ev:
                continue
            wall = (max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)) / 1e6
            busy = sum(e["dur"] for e in ev if e["name"].startswith("judge")) / 1e6
            out[rank] = {"role": "server", "wall_s": wall, "apply_s": busy, "apply_share": busy / wall if wall else 0.0}
            continue
        wall = (max(e["ts"] + e["dur"] for e in main) - min(e["ts"] for e in main)) / 1e6
        sums: dict[str, float] = {"compute": 0.0, "comm": 0.0, "eval": 0.0}
        for e in main:
            k = kind(e)
            sums["compute" if k in ("compute", "slowdown") else k if k in sums else "comm"] += e["dur"] / 1e6
        idle = max(0.0, wall - sum(sums.values()))
        out[rank] = {"role": "worker", "wall_s": wall, "compute_s": sums["compute"], "comm_s": sums["comm"],
                     "eval_s": sums["eval"], "idle_s": idle,
                     **{f"{k}_share": v / wall if wall else 0.0 for k, v in {**sums, "idle": idle}.items()}}
    return out


def plot_timeline(run_dir: Path, out: Path, steps: int = 4) -> list[Path]:
    """A window of `steps` steps in the middle of the run, every rank's lanes."""
    docs = traces(run_dir)
    if not docs:
        return []
    starts = sorted(e["ts"] for d in docs.values() for e in spans(d) if e["name"] == "forward")
    if not starts:
        return []
    per_rank = max(1, len(starts) // max(1, sum(1 for d in docs.values() if any(e["name"] == "forward" for e in spans(d)))))
    mid = starts[len(starts) // 2]
    step_us = (starts[-1] - starts[0]) / max(1, per_rank - 1)
    t0, t1 = mid, mid + steps * step_us
    rows: list[tuple[str, list[tuple[float, float, str]]]] = []
    for rank, doc in sorted(docs.items()):
        lanes = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
        role = doc["traceEvents"][0]["args"]["name"].split("(")[-1].rstrip(")")
        for tid, lane in sorted(lanes.items()):
            bars = [((e["ts"] - t0) / 1e6, e["dur"] / 1e6, kind(e)) for e in spans(doc)
                    if e["tid"] == tid and e["ts"] + e["dur"] >= t0 and e["ts"] <= t1]
            if bars:
                rows.append((f"rank {rank} {role}: {lane}", bars))
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.5))
    for y, (_, bars) in enumerate(rows):
        for x, w, k in bars:
            ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=COLOURS[k], edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1e6)
    ax.set_xlabel("seconds (a window of the run, all ranks on one clock)")
    used = sorted({k for _, bars in rows for _, _, k in bars})
    ax.legend(handles=[Patch(color=COLOURS[k], label=k) for k in used], loc="upper right", fontsize=8, ncol=len(used))
    ax.set_title(f"{Path(run_dir).name}: timeline")
    fig.tight_layout()
    path = out / f"{Path(run_dir).name}-timeline.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def plot_staleness(run_dir: Path, rows: list[dict[str, Any]], out: Path) -> list[Path]:
    pushes = [r for r in rows if r.get("kind") == "push"]
    if not pushes:
        return []
    fig, ax = plt.subplots(figsize=(9, 4))
    for applied, colour, label in ((True, COLOURS["applied"], "applied"), (False, COLOURS["dropped"], "dropped")):
        sel = [r for r in pushes if bool(r.get("applied")) == applied]
        if sel:
            ax.scatter([r["t"] for r in sel], [r["staleness"] for r in sel], s=6, color=colour, label=label, alpha=0.7)
    ax.set_xlabel("seconds since the first push")
    ax.set_ylabel("staleness (versions)")
    ax.set_title(f"{Path(run_dir).name}: staleness of every push")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / f"{Path(run_dir).name}-staleness.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
