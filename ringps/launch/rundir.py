"""Run folders: `runs/NAME/` holding config.yaml, ranks/, logs/, metrics.jsonl, summary.json.

A folder that already holds a finished run is never overwritten: pick another --name or --out.
"""

from __future__ import annotations

import time
from pathlib import Path

from ringps.config import Config
from ringps.errors import ConfigError


def default_name(cfg: Config) -> str:
    return f"{cfg.strategy.strategy}-{time.strftime('%Y%m%d-%H%M%S')}"


def create_run_dir(cfg: Config) -> Path:
    name = cfg.run.name or default_name(cfg)
    out = Path(cfg.run.out) if cfg.run.out else Path("runs") / name
    if (out / "summary.json").exists() or (out / "ranks").exists():
        raise ConfigError(f"--out {out}: already holds a run; choose another --name or --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "ranks").mkdir()
        (out / "logs").mkdir(exist_ok=True)
        (out / "config.yaml").write_text(cfg.to_yaml())
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write the run folder there ({e.strerror or e}); "
                          "choose a writable --out") from None
    return out
