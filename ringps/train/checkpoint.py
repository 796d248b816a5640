"""Checkpoints: one file per rank under `RUN/checkpoints/stepN/`, holding the model, the optimizer,
the strategy's state (residuals, momenta, hook state) and where the loop was.

Each rank saves its own file because strategy state differs between ranks (error-feedback
residuals are per worker); `latest` points at the newest complete step folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import torch

from ringps.errors import ConfigError


def save(run_dir: Path, step: int, rank: int, state: dict[str, Any]) -> Path:
    folder = Path(run_dir) / "checkpoints" / f"step{step}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # never leave a half-written checkpoint behind
    (Path(run_dir) / "checkpoints" / "latest").write_text(f"step{step}\n")
    return path


def resolve(path: str) -> Path:
    """A run folder, its checkpoints folder, or a stepN folder -> the stepN folder."""
    p = Path(path)
    for candidate in (p / "checkpoints" / "latest", p / "latest"):
        if candidate.is_file():
            return candidate.parent / candidate.read_text().strip()
    if p.is_dir() and any(p.glob("rank*.pt")):
        return p
    raise ConfigError(f"--resume {path}: no checkpoint there (expected RUN, RUN/checkpoints or a stepN folder)")


def exists(path: str, rank: int) -> bool:
    try:
        return (resolve(path) / f"rank{rank}.pt").is_file()
    except ConfigError:
        return False


def load(path: str, rank: int) -> Optional[dict[str, Any]]:
    f = resolve(path) / f"rank{rank}.pt"
    if not f.is_file():
        raise ConfigError(f"--resume {path}: {f} is missing (was the run started with the same ranks?)")
    return torch.load(f, map_location="cpu", weights_only=False)
