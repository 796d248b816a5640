"""Small builders shared by tests (configs, contexts, batches)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from ringps.config import Config, validate
from ringps.data.loader import Batch
from ringps.sim.workload import Workload
from ringps.strategies.base import Stretch, WorkerContext


def config(**flat: Any) -> Config:
    return validate(flat)


def context(rank: int, world: int, cfg: Config, out_dir: Path | None = None, group=None, slow: float = 1.0) -> WorkerContext:
    return WorkerContext(
        rank=rank, world_size=world, worker=rank, workers=world, group=group, device=torch.device("cpu"),
        backend="gloo", timeout=60.0, cfg=cfg, out_dir=out_dir or Path(tempfile.mkdtemp()), stretch=Stretch(slow),
    )


def batches(n: int, batch: int, shape=(1, 8, 8), classes: int = 4, seed: int = 0) -> list[Batch]:
    """A learnable toy task: the class is which quarter of the image is bright."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        y = torch.randint(0, classes, (batch,), generator=g)
        x = torch.randn((batch, *shape), generator=g) * 0.3
        h, w = shape[1] // 2, shape[2] // 2
        for i, c in enumerate(y.tolist()):
            r, col = divmod(c, 2)
            x[i, :, r * h : (r + 1) * h, col * w : (col + 1) * w] += 1.0
        out.append(Batch(x, y, torch.arange(batch)))
    return out


def finished_run(folder: Path, strategy: str, summary: dict, rows: list[dict], **run: Any) -> Path:
    """A finished run folder as `ringps train` leaves it (config.yaml, summary.json, metrics.jsonl)
    of facenet, for what reads runs back (`ringps simulate --calibrate`); `run`: run options."""
    import yaml

    folder.mkdir(parents=True)
    cfg = Config().model_dump(mode="json")
    cfg["strategy"]["strategy"], cfg["model"]["model"] = strategy, "facenet"
    cfg["run"].update(run)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return folder


def toy(step_s=1.0, params=1_000_000) -> Workload:
    """A two-layer workload for the simulator: a quarter of the FLOPs in the first layer."""
    return Workload(name="toy", batch=32, step_s=step_s, steps_to_target=100,
                    layers=[{"name": "a", "params": params // 2, "flops": 1.0}, {"name": "b", "params": params // 2, "flops": 3.0}])
