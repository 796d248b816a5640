"""TensorBoard event files for a finished run (`--tensorboard`): `RUN/tb/`, so that
`tensorboard --logdir runs/` shows several runs side by side.

Written once, from the merged rows, when the run is summarised: per worker and step the loss,
step time and its compute / communication / waiting split, utilization, bytes sent, learning
rate and density; the held-out accuracy; for parameter-server runs, histograms of the pushes'
staleness and VSGD weights (one per 10% of the run) and the staleness of every push.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_tensorboard(run_dir: Path, rows: list[dict[str, Any]]) -> Path:
    from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

    out = Path(run_dir) / "tb"
    w = SummaryWriter(log_dir=str(out))
    for r in rows:
        if r.get("kind") == "step":
            tag, step = f"worker{r['worker']}", r["step"]
            comp, exposed = r.get("compute_s") or 0.0, r.get("exposed_s") or 0.0
            values = {"loss": r.get("loss"), "step_s": comp + exposed, "compute_s": comp, "comm_s": r.get("comm_s"),
                      "wait_s": r.get("wait_s"), "utilization": comp / (comp + exposed) if comp + exposed else None,
                      "bytes_sent": r.get("bytes_sent"), "lr": r.get("lr"), "density": r.get("density")}
            for k, v in values.items():
                if isinstance(v, (int, float)):
                    w.add_scalar(f"{tag}/{k}", v, step)
        elif r.get("kind") == "eval":
            w.add_scalar("test/accuracy", r["accuracy"], r["step"])
            w.add_scalar("test/loss", r["test_loss"], r["step"])
    pushes = [r for r in rows if r.get("kind") == "push"]
    if pushes:
        import torch

        chunk = max(1, len(pushes) // 10)
        for i in range(0, len(pushes), chunk):
            part = pushes[i : i + chunk]
            w.add_histogram("ps/staleness", torch.tensor([float(p["staleness"]) for p in part]), i)
            w.add_histogram("ps/weight", torch.tensor([float(p.get("weight") or 0.0) for p in part]), i)
        for i, p in enumerate(pushes):
            w.add_scalar("ps/staleness", p["staleness"], i)
    w.close()
    return out
