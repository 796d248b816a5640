"""Shared machinery of the benchmark scripts: run contenders side by side, repeat, take medians,
print ratio tables and write everything to one folder a user can diff.

Each repeat runs every contender once, in turn (interleaved, so slow drift of this shared
machine hits all of them alike), with seed = repeat index (plus --first-seed where offered). The
spread (min..max over repeats) is printed next to each median: that is how noisy the machine was.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from ringps.cli.main import sigterm_like_ctrl_c  # noqa: E402
from ringps.config import load_config  # noqa: E402
from ringps.launch.run import run_job  # noqa: E402
from ringps.train.summary import refresh_summary  # noqa: E402

console = Console(width=170)


def guarded(main: Callable[[], None]) -> None:
    """Run a benchmark's main: SIGTERM and Ctrl-C stop it after its runs' clean-up (processes,
    emulated hosts), with one line and exit 130; a ringps error is one line too. Finished runs
    stay in the output folder, so `--out DIR` resumes."""
    from ringps.errors import RingpsError

    sigterm_like_ctrl_c()
    try:
        main()
    except KeyboardInterrupt:
        print("benchmark interrupted; its runs were stopped and cleaned up (finished ones stay; --out DIR resumes)",
              file=sys.stderr)
        sys.exit(130)
    except RingpsError as e:
        print(f"benchmark: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


def run_matrix(name: str, settings: dict[str, dict[str, Any]], contenders: dict[str, dict[str, Any]],
               repeats: int, common: dict[str, Any], out: Optional[Path] = None, first_seed: int = 0,
               repeat_major: bool = False, run_missing: bool = True) -> tuple[Path, dict]:
    """settings: label -> options (e.g. {"net": "100mbit"}); contenders: label -> options.
    Repeat i runs with seed first_seed + i (folder suffix r<seed>). By default a setting's repeats
    run together; `repeat_major` runs every setting once before any twice, so the repeats of one
    cell lie far apart in time (a slow spell of this shared machine then spoils one, not all).
    Returns the output folder and {setting: {contender: [summary per repeat]}}.

    Given an existing `out` (--out DIR of the scripts), runs whose summary.json is already there
    are read back, not rerun: an interrupted benchmark resumes where it stopped. `run_missing`
    False reads back only (a report of a stopped benchmark's finished runs)."""
    out = out or Path("runs") / f"bench-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    total = len(settings) * len(contenders) * repeats
    done = 0
    reps = range(first_seed, first_seed + repeats)
    order = ([(s, r) for r in reps for s in settings] if repeat_major else [(s, r) for s in settings for r in reps])
    results = {s: {c: [] for c in contenders} for s in settings}
    for slabel, rep in order:
        sopts = settings[slabel]
        for clabel, copts in contenders.items():
            done += 1
            opts = {**common, **sopts, **copts, "seed": rep, "progress": False,
                    "out": str(out / slabel / f"{clabel}-r{rep}"), "name": f"{clabel}-r{rep}"}
            console.print(f"[{done}/{total}] {slabel} / {clabel} / repeat {rep}", style="bold")
            t0 = time.time()
            previous = Path(opts["out"]) / "summary.json"
            if previous.exists():
                s = refresh_summary(Path(opts["out"]))  # recomputed with today's definitions
                s["run_dir"] = opts["out"]  # where it is now (the folder may have moved)
                console.print("    (read back from an earlier run of this benchmark)")
            elif not run_missing:
                console.print("    (not run: reading back only)")
                continue
            else:
                # a folder without summary.json is a run that was interrupted: start it over
                shutil.rmtree(opts["out"], ignore_errors=True)
                s = run_job(load_config(None, opts), Console(stderr=True, quiet=True))
            s["label"] = clabel
            results[slabel][clabel].append(s)
            console.print(f"    wall {s['wall_s']:.0f}s, time-to-acc {s['time_to_accuracy_s']}, "
                          f"final {s['final_accuracy']}, job {time.time() - t0:.0f}s")
            (out / "results.json").write_text(json.dumps(strip(results), indent=1))
    return out, results


def contenders_from(spec: str, options: Callable[[str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """'A,B+key=value+key=value' -> {label: run options}: `options(name)` gives a contender's own
    options; each `+key=value` (a config key, as the CLI flag without dashes) adds one, so variants
    of one contender run side by side: `ps-dcasgd,ps-dcasgd+dcasgd_lambda=0`."""
    out = {}
    for label in filter(None, spec.split(",")):
        name, *extra = label.split("+")
        pairs = [kv.partition("=") for kv in extra]
        if any(not sep for _, sep, _ in pairs):
            raise SystemExit(f"contender {label!r}: write each extra option as +key=value")
        out[label] = {**options(name), **{k.replace("-", "_"): v for k, _, v in pairs}}
    return out


def add_out_arg(p) -> None:
    p.add_argument("--out", type=Path, default=None,
                   help="output folder; an existing one is resumed (finished runs are read back)")


def strip(results: dict) -> dict:
    keep = ("label", "strategy", "time_to_accuracy_s", "final_accuracy", "best_accuracy", "wall_s", "utilization",
            "step_s_median", "pushes_applied", "pushes_dropped", "max_applied_staleness", "staleness_histogram",
            "bytes_sent_per_step", "compute_s_per_step", "comm_s_per_step", "wait_s_per_step", "loss_spikes",
            "steps", "net", "slowdown", "run_dir", "diverged", "strategy_stats", "accuracy_setbacks")
    return {s: {c: [{k: r.get(k) for k in keep} for r in runs] for c, runs in cs.items()} for s, cs in results.items()}


def med(runs: list[dict], key: str) -> Optional[float]:
    """The median over all runs. A time-to-accuracy of a run that never reached the target counts
    as slower than any that did (the median over the reached runs alone would flatter a policy
    that fails some seeds); None when the median itself is such a run, or when more than half
    the runs lack the figure."""
    if key == "time_to_accuracy_s":
        m = statistics.median([math.inf if r.get(key) is None else r[key] for r in runs]) if runs else math.inf
        return None if math.isinf(m) else m
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals and len(vals) * 2 > len(runs) else None


def spread(runs: list[dict], key: str) -> str:
    vals = [r[key] for r in runs if r.get(key) is not None]
    if len(vals) < 2:
        return ""
    return f" [{min(vals):.3g}..{max(vals):.3g}]"


COLUMNS = [("time-to-acc s", "time_to_accuracy_s", True), ("final acc", "final_accuracy", False),
           ("wall s", "wall_s", True), ("step s", "step_s_median", True), ("utilization", "utilization", True),
           ("MB/step", "bytes_sent_per_step", True), ("comm s/step", "comm_s_per_step", False),
           ("spikes", "loss_spikes", False), ("setbacks", "accuracy_setbacks", False)]


def table(title: str, runs_by: dict[str, list[dict]], ref: str) -> Table:
    """One row per contender; ratios to `ref`, or to the first contender where `ref` did not run."""
    if ref not in runs_by:
        ref = next(iter(runs_by))
        title = f"{title.split(':')[0]}: ratios to {ref}"
    t = Table(title=title, title_justify="left")
    t.add_column("contender", style="bold")
    for header, _, _ in COLUMNS:
        t.add_column(header + r" (median \[min..max])", justify="right")  # \[: not rich markup
    for label, runs in runs_by.items():
        cells = [label]
        for _, key, ratio in COLUMNS:
            m = med(runs, key)
            scale = 1e-6 if key == "bytes_sent_per_step" else 1.0
            if m is None:
                cells.append("-" + spread(runs, key))
                continue
            text = f"{m * scale:.3g}" + spread([{key: (r[key] * scale if r.get(key) is not None else None)} for r in runs], key)
            r0 = med(runs_by[ref], key)
            if ratio and label != ref and r0:
                text += f" ({m / r0:.2f}x)"
            cells.append(text)
        t.add_row(*cells)
    return t


def verdict(lines: list[tuple[str, bool, str]]) -> list[str]:
    out = []
    for claim, ok, numbers in lines:
        out.append(f"{'MET   ' if ok else 'MISSED'} {claim}: {numbers}")
    return out


def finish(out: Path, lines: list[str], checks: list[tuple[str, bool, str]]) -> None:
    """Print the verdict on each bar, then write report.txt: the summary lines and the verdicts."""
    for line in verdict(checks):
        console.print(line)
        lines.append(line)
    write_report(out, "\n".join(lines) + "\n")


def write_report(out: Path, text: str) -> None:
    (out / "report.txt").write_text(text)
    found = [*out.glob("results.json"), *out.glob("*/results.json")]  # a setting run in its own folder (layers)
    console.print(f"\nresults: {', '.join(map(str, found))}, {out}/report.txt")
