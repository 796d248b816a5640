"""Per-rank metric rows, streamed to `RUN/ranks/rankR.jsonl` as they happen.

One file per rank keeps a crash from losing what was already measured and needs no
coordination; `summary.finalize` merges them into `metrics.jsonl`. Row kinds: `step` (one per
worker per step), `eval` (held-out accuracy), `push` (one per parameter-server push).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


class Recorder:
    def __init__(self, out_dir: Path, rank: int, name: str | None = None):
        self.path = Path(out_dir) / "ranks" / (name or f"rank{rank}.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", buffering=1)  # line-buffered: the launcher tails it

    def write(self, kind: str, **row: Any) -> None:
        row = {"kind": kind, **{k: _clean(v) for k, v in row.items()}}
        self._f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        self._f.close()


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of one jsonl file; a torn last line (a killed writer) is skipped."""
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def rank_files(run_dir: Path) -> list[Path]:
    return sorted((Path(run_dir) / "ranks").glob("*.jsonl"))
