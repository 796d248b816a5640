"""Terminal tables: one run's summary, and runs side by side with ratios to the first."""

from __future__ import annotations

from typing import Any, Callable, Optional

from rich.console import Console
from rich.table import Table


def _secs(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.1f}s"


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _bytes(v: Optional[float]) -> str:
    if v is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(v) < 1000 or unit == "GB":
            return f"{v:.0f}{unit}" if unit == "B" else f"{v:.2f}{unit}"
        v /= 1000
    return "-"


def _ratio(v: Optional[float], ref: Optional[float]) -> str:
    if v is None or ref is None or ref == 0:
        return ""
    return f" ({v / ref:.2f}x)"


# (header, summary key, formatter, show a ratio to the first run)
COLUMNS: list[tuple[str, str, Callable[[Any], str], bool]] = [
    ("time-to-acc", "time_to_accuracy_s", _secs, True),
    ("final acc", "final_accuracy", _pct, False),
    ("wall", "wall_s", _secs, True),
    ("utilization", "utilization", _pct, True),
    ("bytes/step", "bytes_sent_per_step", _bytes, True),
    ("compute/step", "compute_s_per_step", _secs, False),
    ("comm/step", "comm_s_per_step", _secs, False),
    ("wait/step", "wait_s_per_step", _secs, False),
    ("spikes", "loss_spikes", str, False),
]
# shown only when some run has them (parameter-server runs)
OPTIONAL: list[tuple[str, str, Callable[[Any], str], bool]] = [
    ("step", "step_s_median", _secs, True),
    ("pushes applied", "pushes_applied", str, False),
    ("dropped", "pushes_dropped", str, False),
    ("max staleness", "max_applied_staleness", str, False),
    ("mean weight", "mean_weight", lambda v: f"{v:.3f}", False),  # vsgd, stale-lr
]


def summary_table(summaries: list[dict[str, Any]], title: str = "") -> Table:
    """Rows = runs; figures of later rows carry their ratio to the first row's."""
    t = Table(title=title or None, title_justify="left")
    t.add_column("strategy", style="bold")
    columns = COLUMNS + [c for c in OPTIONAL if any(s.get(c[1]) is not None for s in summaries) and
                         (c[1] != "step_s_median" or any(s.get("pushes_applied") is not None for s in summaries))]
    for header, *_ in columns:
        t.add_column(header, justify="right")
    ref = summaries[0] if summaries else {}
    for i, s in enumerate(summaries):
        cells = [s.get("label") or s["strategy"]]
        for _, key, fmt, ratio in columns:
            v = s.get(key)
            text = fmt(v) if v is not None else "-"
            if ratio and i > 0:
                text += _ratio(v, ref.get(key))
            cells.append(text)
        t.add_row(*cells)
    return t


def setting_line(s: dict[str, Any]) -> str:
    """What every report states: data, model, workers, network shaping, slowdown."""
    net = s.get("placement") if s.get("net") else "unshaped loopback"
    net = net or s.get("net")
    slow = ",".join(f"{f:g}" for f in s["slowdown"]) if s.get("slowdown") else "none"
    target = s.get("target_accuracy")
    tgt = f"{100 * target:.0f}%" if target is not None else "-"
    return (f"{s['dataset']} / {s['model']} / {s['workers']} workers / net: {net} / slowdown: {slow} / "
            f"target accuracy {tgt}")


def wide_console(stderr: bool = False) -> Console:
    """A console that keeps tables readable when output goes to a file or a CI log."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=160)


def print_summaries(summaries: list[dict[str, Any]], console: Console, title: str = "") -> None:
    if not summaries:
        return
    console.print(setting_line(summaries[0]))
    console.print(summary_table(summaries, title))
    for s in summaries:
        for rank, why in (s.get("failed_workers") or {}).items():
            console.print(f"[yellow]{s['strategy']}: {why}[/yellow]")
