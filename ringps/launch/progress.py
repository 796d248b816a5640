"""The launcher's progress bar: it tails worker 0's rows (steps, loss, held-out accuracy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class ProgressView:
    def __init__(self, run_dir: Path, title: str, console: Optional[Console] = None, enabled: bool = True):
        self.path = Path(run_dir) / "ranks" / "rank0.jsonl"
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self._pos = 0
        self._buf = ""
        self.loss: Optional[float] = None
        self.accuracy: Optional[float] = None
        self.total: Optional[int] = None
        self.done = 0
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=self.console, disable=not enabled, transient=False,
        )
        self.task = self.progress.add_task(title, total=None, status="starting")
        self.notes: set[int] = set()

    def __enter__(self) -> "ProgressView":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def _new_rows(self) -> list[dict]:
        if not self.path.is_file():
            return []
        with self.path.open() as f:
            f.seek(self._pos)
            chunk = f.read()
            self._pos = f.tell()
        self._buf += chunk
        lines = self._buf.split("\n")
        self._buf = lines.pop()  # keep a partial last line for the next read
        return [json.loads(line) for line in lines if line.strip()]

    def update(self) -> None:
        for row in self._new_rows():
            kind = row.get("kind")
            if kind == "start":
                self.total = row["steps"]
                self.progress.update(self.task, total=row["steps"])
            elif kind == "step":
                # the job's progress (an asynchronous worker's own count may run past its share)
                self.loss = row["loss"]
                done = max(self.done, row.get("progress", row["step"]))
                self.done = done if self.total is None else min(done, self.total)
                self.progress.update(self.task, completed=self.done)
            elif kind == "eval":
                self.accuracy = row["accuracy"]
        parts = []
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        if self.accuracy is not None:
            parts.append(f"acc {self.accuracy:.1%}")
        self.progress.update(self.task, status="  ".join(parts) or "starting")

    def note_failure(self, rank: int, reason: str) -> None:
        if rank not in self.notes:
            self.notes.add(rank)
            self.console.print(f"[yellow]worker {reason}; the others carry on[/yellow]")
