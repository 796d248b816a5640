"""Benchmark: the simulator against this machine's emulated cluster, and beyond it.

1. Validation grid (short runs, cached in --out): facenet on ORL, workers 2, 3 and 4, links
   100 Mbit/s and 1 Gbit/s (tc-shaped hosts) and unshaped (loopback), slowdown equal (and 1,1,2,4
   at 4 workers on the shaped links), strategies allreduce, fp16, powersgd, ring-topk, ps-async,
   ps-threshold, and ps-sync and ps-vsgd where the link is not 100 Mbit/s (there 8 pushes of the
   whole model by every worker take minutes a cell; --more-ps-everywhere runs them). The simulator
   is calibrated on the 2-worker cells (compute scales, jitter, link efficiency, CPU per byte moved) and
   validated on the 3- and 4-worker cells; the servers' lossy links' duplex factor (what each
   direction carries while pushes and replies cross at once) is measured apart by
   benchmarks/server_link.py (--duplex; the shipped results by default), not fitted. Each cell
   is measured --repeats times (seeds 0, 1, ...; every cell once before any twice) and counts by
   its fastest repeat, the least disturbed by the machine's other tenants; the repeats' own
   spread is the noise floor no model can beat. A 2-worker
   loopback allreduce before each setting's contenders (`reference-rN`) tracks the machine's speed:
   the validation is also reported with each run's compute scaled by its nearest reference. Per cell
   the step-time error, and for the parameter servers the mean staleness predicted and measured and
   the distance between the two staleness histograms; the share within 15%, the median error, and
   Kendall's tau of the strategies' order by step time per setting. (The layer strategy is not in
   the grid: the engine sends a push whole.)
2. Extrapolation: efficiency against N (up to 1,024) per strategy at 1, 10 and 100 Gbit/s for
   the facenet and ResNet-50 (K80) profiles, as a table and scaling.png.
3. Published results: predicted against published scaling efficiency, side by side.

    .venv/bin/python benchmarks/simulator.py --steps 8 --repeats 2 --out runs/bench-sim   # grid + all
    .venv/bin/python benchmarks/simulator.py --skip-grid --out runs/bench-sim
    .venv/bin/python benchmarks/simulator.py --settings w2-unshaped,w3-unshaped,w4-unshaped --out runs/bench-sim-lo
    .venv/bin/python benchmarks/simulator.py --read runs/bench-sim-lo runs/bench-sim-1g --out runs/bench-sim-parts --grid-only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import yaml
from common import add_out_arg, console, guarded, run_matrix
from rich.table import Table

from ringps.sim.auto import rank
from ringps.sim.calibrate import cluster_for, duplex_from_probes, fit, fit_cpu, read_run
from ringps.sim.cluster import ClusterSpec
from ringps.sim.engine import Options
from ringps.sim.predict import Progress, load_progress, simulate
from ringps.sim.workload import load_workload

STRATEGIES = ["allreduce", "fp16", "powersgd", "ring-topk", "ps-async", "ps-threshold"]
MORE_PS = ["ps-sync", "ps-vsgd"]
# run before each setting's contenders: a 2-worker loopback allreduce, whose compute per step
# tracks this shared machine's speed through the grid (its other tenants come and go)
REFERENCE = {"reference": {"strategy": "allreduce", "workers": 2, "net": None, "slowdown": None}}
NEAR_S = 900  # a reference speaks for the runs within this many seconds of it
# what each direction of a server's lossy link carries while pushes and replies cross it at once,
# per worker count: measured by benchmarks/server_link.py (not fitted to the grid); --duplex
PROBES = sorted((Path(__file__).resolve().parents[1] / "docs" / "results" / "server-link").glob("results*.json"))
DUPLEX: dict = {}  # set from --duplex in main
PUBLISHED = [  # (label, profile, cluster, strategy, published efficiency, source)
    ("ResNet-101, 512 P100 (128 x 4), 25 Gbit/s RoCE", "resnet101-p100",
     {"workers": 512, "net": "25gbit", "node_size": 4, "intra_net": "80gbit"}, "allreduce", 0.90,
     "Horovod docs/benchmarks (Sergeev & Del Balso 2018): 90% scaling efficiency"),
    ("VGG-16, 512 P100 (128 x 4), 25 Gbit/s RoCE", "vgg16-p100",
     {"workers": 512, "net": "25gbit", "node_size": 4, "intra_net": "80gbit"}, "allreduce", 0.68,
     "Horovod docs/benchmarks: 68% scaling efficiency"),
    # TensorFlow ran it with variable_update=distributed_replicated: each host sums its 8 GPUs'
    # gradients and pushes once per step to the 8 parameter servers (one per host), so the
    # cluster is 8 pushing hosts, each computing a K80's step; the sum inside the host (PCIe) is
    # not modelled. Simulating 64 GPUs pushing one by one, as an earlier version did, gave 47-61%.
    ("ResNet-50, 64 K80 (8 x p2.8xlarge), 10 Gbit/s, parameter servers (one push per host)", "resnet50-k80",
     {"workers": 8, "net": "10gbit", "servers": 8}, "ps-sync",
     2744 / (64 * 52.4), "TensorFlow benchmarks, EC2 distributed K80 (distributed_replicated, 8 parameter servers "
     "on the 8 hosts): 2744 img/s on 64 GPUs vs 52.4 on 1"),
]


def kendall(a: list[float], b: list[float]) -> float:
    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    s = sum((a[i] - a[j]) * (b[i] - b[j]) > 0 for i, j in pairs) - sum((a[i] - a[j]) * (b[i] - b[j]) < 0 for i, j in pairs)
    return s / len(pairs) if pairs else 1.0


def grid_settings() -> dict[str, dict]:
    """The grid's settings in the order they run: link by link, each link's 2-worker setting (the
    calibration's) just before its 3- and 4-worker ones (the validation's), so the machine's speed,
    which drifts over hours here, moves less between the runs fitted and the runs predicted."""
    settings = {}
    for net in ("100mbit", "1gbit", None):
        for n in (2, 3, 4):
            name = f"w{n}-{net or 'unshaped'}"
            settings[name] = {"workers": n} | ({"net": net} if net else {})
            if n == 4 and net:
                settings[f"{name}-slow"] = {"workers": n, "net": net, "slowdown": "1,1,2,4"}
    return settings


def grid(args) -> list[Path]:
    settings = grid_settings()
    if args.settings:  # a part of the grid (its 2-worker cells calibrate it, as the whole grid's do)
        settings = {k: v for k, v in settings.items() if k in args.settings}
    # steady state: the simulator predicts a strategy's step after its warm-up (PowerSGD's dense
    # first steps, ring-topk's density ramp) and before ring-topk's exact tail, and a short run
    # would be mostly warm-up and tail
    common = {"dataset": "orl-faces", "model": "facenet", "steps": args.steps, "target_accuracy": None, "eval_every": 1000,
              "powersgd_start_iter": 2, "density_warmup_epochs": 0, "exact_tail": 0}
    # every cell once before any twice: the repeats of a cell lie far apart in time
    first = args.first_repeat
    run_matrix("sim-grid", settings, REFERENCE | {s: {"strategy": s} for s in STRATEGIES}, args.repeats - first, common,
               args.out, first_seed=first, repeat_major=True)
    more = {k: v for k, v in settings.items() if args.more_ps_everywhere or v.get("net") != "100mbit"}
    run_matrix("sim-grid", more, REFERENCE | {s: {"strategy": s} for s in MORE_PS}, args.repeats - first, common,
               args.out / "more-ps", first_seed=first, repeat_major=True)
    # every repeat in the folder counts, those before --first-repeat too
    return runs_in(args.out)


def runs_in(out: Path) -> list[Path]:
    """The finished grid runs in a benchmark's output folder (its more-ps part included)."""
    return sorted(r.parent for d in (out, out / "more-ps") for r in d.glob("w*/*-r*/summary.json"))


def staleness(hist: dict) -> tuple[float, dict[int, float]]:
    """The mean and the distribution of a staleness histogram ({staleness: pushes}, keys as text or int)."""
    total = sum(hist.values()) or 1
    dist = {int(k): v / total for k, v in hist.items()}
    return sum(k * p for k, p in dist.items()), dist


def cells(measured: list) -> dict[tuple[str, str], list]:
    """The runs grouped by cell (setting, strategy): one Measured per repeat."""
    out: dict[tuple[str, str], list] = {}
    for m in measured:
        out.setdefault((m.run.parent.name, m.label or m.strategy), []).append(m)
    return out


def split(measured: list) -> tuple[list, list]:
    """(calibration, validation): the 2-worker runs and the others."""
    return [m for m in measured if m.workers == 2], [m for m in measured if m.workers != 2]


def started(run: Path) -> float:
    """When a run started (the wall clock of its first row)."""
    with open(run / "metrics.jsonl") as f:
        return json.loads(f.readline())["wall"]


def tracked(measured: list, references: list, w) -> list[str]:
    """The validation with the machine's speed tracked: each run's compute scaled by its nearest
    speed reference's compute against the calibration runs' references (runs with no reference
    within NEAR_S are left out). Calibrated on the 2-worker runs, validated on the others, run by run."""
    refs = [(started(r.run), r.compute_s) for r in references]
    if not refs:
        return []
    speed = {}
    for m in measured:
        t = started(m.run)
        near = min(refs, key=lambda x: abs(x[0] - t))
        if abs(near[0] - t) <= NEAR_S:
            speed[m.run] = near[1]
    calib, test = split([m for m in measured if m.run in speed])
    if not calib or not test:
        return []
    base = statistics.median(speed[m.run] for m in calib)
    f = fit(calib, w, DUPLEX)
    cpu = fit_cpu(calib, w, f)
    errs = []
    for m in test:
        c = cluster_for(m, f)
        c = c.model_copy(update={"compute_scale": c.compute_scale * speed[m.run] / base})
        p = simulate(m.strategy, w, c, m.options or Options(), Progress(cpu_s=cpu), steps=20)
        errs.append(abs(p.step_s - m.step_s) / m.step_s)
    ratios = [speed[m.run] / base for m in test]
    return [f"with the machine's speed tracked by {len(refs)} reference runs (their compute {min(ratios):.2f}-"
            f"{max(ratios):.2f}x the calibration runs'), run by run: {agreement(errs)}"]


def noise_floor(by_cell: dict) -> list[str]:
    """How far two measurements of one cell lie apart: the bound on any model's agreement."""
    spreads = [max(m.step_s for m in ms) / min(m.step_s for m in ms) - 1 for ms in by_cell.values() if len(ms) > 1]
    if not spreads:
        return []
    return [f"noise floor: the repeats of {len(spreads)} cells lie within 15% of each other (slowest against "
            f"fastest) in {sum(x <= 0.15 for x in spreads) / len(spreads):.0%}, median {statistics.median(spreads):.1%}, "
            f"largest {max(spreads):.0%}"]


def score(calib: list, test: list, w, show: bool, charge_bytes: bool = False) -> tuple[list[float], dict, list[float], object, dict]:
    """Calibrate on `calib`, predict `test`: (|errors|, {setting: [(cell, measured, predicted)]}, staleness
    histogram distances, the fit, strategies' CPU); with `show` a table per cell; `charge_bytes`:
    the host kernel's CPU per byte moved charged on the workers' cores (the model before 2026-12-07)."""
    f = fit(calib, w, DUPLEX, charge_bytes)
    cpu = fit_cpu(calib, w, f)
    t = Table("cell", "strategy", "measured step s", "predicted", "error", "staleness: measured mean", "predicted",
              "histogram distance", title="validation (not used to calibrate)")
    errs, by_setting, tv = [], {}, []
    for m in test:
        p = simulate(m.strategy, w, cluster_for(m, f), m.options or Options(), Progress(cpu_s=cpu), steps=20)
        err = (p.step_s - m.step_s) / m.step_s
        errs.append(abs(err))
        key = m.run.parent.name
        by_setting.setdefault(key, []).append((m.label or m.strategy, m.step_s, p.step_s))
        stale = ["", "", ""]
        if m.extra.get("staleness_histogram") and "staleness_histogram" in p.extra:
            (mm, md), (pm, pd) = staleness(m.extra["staleness_histogram"]), staleness(p.extra["staleness_histogram"])
            d = sum(abs(md.get(k, 0.0) - pd.get(k, 0.0)) for k in set(md) | set(pd)) / 2  # total variation
            tv.append(d)
            stale = [f"{mm:.2f}", f"{pm:.2f}", f"{d:.2f}"]
        t.add_row(key, m.strategy, f"{m.step_s:.3f}", f"{p.step_s:.3f}", f"{err:+.0%}", *stale)
    if show:
        console.print(t)
    return errs, by_setting, tv, f, cpu


def separable(key: str, rows: list, spans: dict) -> str:
    """Kendall's tau over the pairs of strategies whose repeats do not overlap (the pairs the
    measurement itself can order; the others are ties within the machine's noise). rows: (cell,
    measured, predicted); spans: (setting, cell) -> the repeats' (fastest, slowest) step."""
    s = n = 0
    for i, (a, ma, pa) in enumerate(rows):
        for b, mb, pb in rows[i + 1:]:
            (lo_a, hi_a), (lo_b, hi_b) = spans[(key, a)], spans[(key, b)]
            if hi_a < lo_b or hi_b < lo_a:
                n += 1
                agree = (ma - mb) * (pa - pb)
                s += (agree > 0) - (agree < 0)  # a tie in the prediction counts neither way
    pairs = len(rows) * (len(rows) - 1) // 2
    return f"over the {n} of {pairs} pairs whose repeats do not overlap {s / n:.2f}" if n else "no pair's repeats apart"


def agreement(errs: list[float]) -> str:
    return (f"within 15% in {sum(e <= 0.15 for e in errs) / len(errs):.0%} of {len(errs)} cells (bar 90%); "
            f"median error {statistics.median(errs):.1%} (bar 10%)")


def validate(runs: list[Path], w) -> list[str]:
    """Calibrate on the 2-worker cells, validate on the others. A cell measured more than once
    counts by its fastest repeat: other tenants of this shared machine only ever slow a run down,
    so the fastest is the least disturbed (timeit's reasoning for its minimum); every run on its
    own and the repeats' own spread are reported beside it."""
    measured = [read_run(r) for r in runs]
    references = [m for m in measured if m.label == "reference"]  # the machine's speed, not cells
    every = [m for m in measured if m.label != "reference"]
    by_cell = cells(every)
    calib, test = split([min(ms, key=lambda m: m.step_s) for ms in by_cell.values()])
    errs, by_setting, tv, f, cpu = score(calib, test, w, show=True)
    repeats = max(len(ms) for ms in by_cell.values())
    lines = [f"calibrated on {len(calib)} 2-worker cells: compute = {f.compute_a:.3f} x profile per whole core "
             f"(a parameter-server worker's {f.ps_compute_a or f.compute_a:.3f}), jitter {f.jitter:.3f}, CPU "
             f"per byte moved charged {f.cpu_per_byte:.3g} s, link efficiency {f.efficiency:.3f}, the servers' per link "
             f"{f.server_efficiency} (on a lossy link, each direction while both are busy x {f.duplex or 1}, by "
             f"workers, measured apart), strategies' own CPU per step {cpu}; validated on {len(test)} cells with 3-4 workers"
             f" ({repeats} repeat(s) a cell, each counted by its fastest)",
             f"step time {agreement(errs)}"]
    lines += noise_floor(by_cell)
    if tv:
        lines.append(f"staleness histograms of {len(tv)} parameter-server cells: total variation distance, predicted "
                     f"against measured, median {statistics.median(tv):.2f} (0: the same distribution, 1: disjoint)")
    spans = {k: (min(m.step_s for m in ms), max(m.step_s for m in ms)) for k, ms in by_cell.items()}
    for key, rows in sorted(by_setting.items()):
        tau = kendall([x for _, x, _ in rows], [y for _, _, y in rows])
        line = f"{key}: Kendall tau of the strategies' order by step time {tau:.2f} (bar 0.8)"
        lines.append(line + ("; " + separable(key, rows, spans) if repeats > 1 else ""))
    if repeats > 1:  # every run on its own, calibrated on every 2-worker run: what one repeat would give
        each = score(*split(every), w, show=False)[0]
        lines.append(f"every run on its own (not the fastest repeat): {agreement(each)}")
    lines += tracked(every, references, w)
    # the same cells with the host kernel's CPU per byte charged (the model before 2026-12-07)
    charged, _, _, f_charged, _ = score(calib, test, w, show=False, charge_bytes=True)
    lines.append(f"with the host kernel's CPU per byte moved charged ({f_charged.cpu_per_byte:.3g} s, as before "
                 f"2026-12-07): {agreement(charged)}")
    return lines


def layered(run: Path) -> bool:
    """A parameter-server run with the layer strategy on, which the simulator does not model."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    return (cfg.get("strategy") or {}).get("layer_strategy", "off") != "off"


def tta_ranks(folders: list[Path]) -> list[str]:
    """Time-to-accuracy, predicted against measured, for the runs of other benchmarks' output
    folders (`ring_topk.py --out DIR`): per setting, the contenders' median measured time against
    the prediction for their own settings (compute and link efficiency fitted on those runs, each
    contender's own CPU per step, the shipped progress model), and Kendall's tau of the two orders."""
    lines = []
    for folder in folders:
        for setting in sorted(p for p in folder.iterdir() if p.is_dir()):
            runs = [read_run(r) for r in sorted(setting.iterdir()) if (r / "summary.json").is_file()]
            if not runs:
                continue
            w = load_workload(runs[0].model)
            f = fit(runs, w, DUPLEX)
            prog = load_progress(None).model_copy(update={"cpu_s": fit_cpu(runs, w, f)})
            by_label: dict[str, list] = {}
            for m in runs:
                by_label.setdefault(m.run.name.rsplit("-r", 1)[0], []).append(m)
            t = Table("contender", "measured s (median)", "predicted s", title=f"{folder.name}/{setting.name}: time to the target")
            pairs = []
            for label, ms in by_label.items():
                meas = [m.time_to_accuracy_s for m in ms if m.time_to_accuracy_s is not None]
                if layered(ms[0].run):  # the engine sends a push whole: its prediction would be of another job
                    t.add_row(label, f"{statistics.median(meas):.1f}", "not modelled (layer strategy)")
                    continue
                if len(meas) * 2 <= len(ms):
                    t.add_row(label, "not reached (median)", "")
                    continue
                own = prog.model_copy(update={"cpu_s": fit_cpu(ms, w, f)})  # this variant's own CPU per step
                pred = simulate(ms[0].strategy, w, cluster_for(ms[0], f), ms[0].options, own,
                                steps=20).extra["time_to_accuracy_s"]
                pairs.append((statistics.median(meas), pred))
                t.add_row(label, f"{statistics.median(meas):.1f}", f"{pred:.1f}" if pred else "-")
            console.print(t)
            pairs = [(x, y) for x, y in pairs if y is not None]
            tau = kendall([x for x, _ in pairs], [y for _, y in pairs])
            lines.append(f"{folder.name}/{setting.name}: Kendall tau of the contenders' order by time-to-accuracy, "
                         f"predicted against measured: {tau:.2f} over {len(pairs)} contenders (bar 0.8)")
            # --strategy auto on this cluster: its pick against the best measured contender
            pick = rank(w, cluster_for(runs[0], f), prog)[0].strategy
            measured = {label: statistics.median(x) for label, ms in by_label.items()
                        if len(x := [m.time_to_accuracy_s for m in ms if m.time_to_accuracy_s is not None]) * 2 > len(ms)}
            best = min(measured, key=measured.get)
            verdict = (f"{measured[pick]:.1f}s vs the best, {best}, {measured[best]:.1f}s: "
                       f"{'within' if measured[pick] <= 1.1 * measured[best] else 'NOT within'} 10%"
                       if pick in measured else "measured, but its median run never reached the target"
                       if pick in by_label else "not among the measured contenders")
            lines.append(f"{folder.name}/{setting.name}: --strategy auto picks {pick}; {verdict}")
    return lines


def scaling(out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = []
    ns = [1, 4, 16, 64, 256, 1024]
    strategies = ["allreduce", "fp16", "powersgd", "ring-topk", "localsgd", "ps-async"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), sharey=True)
    for row, profile in enumerate(("facenet", "resnet50-k80")):
        w = load_workload(profile)
        for col, net in enumerate(("1gbit", "10gbit", "100gbit")):
            ax = axes[row][col]
            t = Table("strategy", *[str(n) for n in ns], title=f"{profile}, {net}: efficiency (1-worker step / step)")
            for s in strategies:
                effs = []
                for n in ns:
                    c = ClusterSpec(workers=n, net=net, servers=max(1, n // 8))
                    t0 = time.perf_counter()
                    p = simulate(s, w, c, Options(), Progress(), steps=6)
                    effs.append(w.compute_s / p.step_s)
                    if n == 1024 and time.perf_counter() - t0 > 60:
                        lines.append(f"{profile}/{net}/{s} at 1,024 workers took {time.perf_counter() - t0:.0f}s (bar 60s)")
                t.add_row(s, *[f"{e:.0%}" for e in effs])
                ax.plot(ns, effs, marker=".", label=s)
            console.print(t)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{profile} at {net}")
            ax.set_xlabel("workers")
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("scaling efficiency")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=100)
    lines.append(f"scaling curves: {out / 'scaling.png'}")
    return lines


def published() -> list[str]:
    lines = []
    t = Table("result", "strategy", "published efficiency", "predicted", "gap", "source")
    for label, profile, cluster, strategy, pub, source in PUBLISHED:
        w = load_workload(profile)
        one = simulate("allreduce", w, ClusterSpec(workers=1, net=cluster["net"]), Options(), Progress(), steps=4).step_s
        p = simulate(strategy, w, ClusterSpec(**cluster), Options(), Progress(), steps=6)
        eff = one / p.step_s
        gap = (eff - pub) / pub
        t.add_row(label, strategy, f"{pub:.0%}", f"{eff:.0%}", f"{gap:+.0%}", source)
        lines.append(f"published: {label}: {pub:.1%} published, {eff:.1%} predicted ({gap:+.0%}; bar: within 20%)")
    console.print(t)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="steps per grid run")
    p.add_argument("--repeats", type=int, default=2, help="measurements of each grid cell (seeds 0, 1, ...)")
    p.add_argument("--first-repeat", type=int, default=0,
                   help="run the repeats from this one on (the earlier ones in --out are read, not completed)")
    p.add_argument("--settings", type=lambda v: v.split(","), default=None,
                   help="only these grid settings, comma-separated (e.g. w2-unshaped,w3-unshaped,w4-unshaped); "
                        "calibrated on their 2-worker cells")
    p.add_argument("--read", nargs="+", type=Path, default=[], metavar="DIR",
                   help="run nothing: validate the grid runs already in these output folders together (parts "
                        "measured apart, e.g. one --settings each), calibrated on all their 2-worker cells")
    p.add_argument("--skip-grid", action="store_true")
    p.add_argument("--grid-only", action="store_true",
                   help="the validation alone: neither the scaling curves nor the published results (a minute)")
    p.add_argument("--more-ps-everywhere", action="store_true", help="ps-sync and ps-vsgd at 100 Mbit/s too")
    p.add_argument("--tta", nargs="*", type=Path, default=[], metavar="DIR",
                   help="output folders of benchmarks/ring_topk.py: rank their contenders by predicted time-to-accuracy")
    p.add_argument("--duplex", nargs="*", type=Path, default=PROBES, metavar="JSON",
                   help="benchmarks/server_link.py results.json files: the servers' lossy links' duplex factor per "
                        "worker count (default: the shipped measurements; none given: directions independent)")
    add_out_arg(p)
    args = p.parse_args()
    DUPLEX.update(duplex_from_probes(args.duplex) if args.duplex else {})
    known = grid_settings()
    unknown = sorted(set(args.settings or ()) - set(known))
    if unknown:
        p.error(f"--settings {','.join(unknown)}: not a grid setting; known: {', '.join(known)}")
    out = args.out or Path("runs") / "bench-sim"
    out.mkdir(parents=True, exist_ok=True)
    args.out = out
    lines = []
    if args.read:
        missing = [str(d) for d in args.read if not runs_in(d)]
        if missing:
            p.error(f"--read {' '.join(missing)}: no finished grid runs there (w*/*-rN/summary.json)")
        lines += validate(sorted(r for d in args.read for r in runs_in(d)), load_workload("facenet"))
    elif not args.skip_grid:
        lines += validate(grid(args), load_workload("facenet"))
    lines += tta_ranks(args.tta) + ([] if args.grid_only else scaling(out) + published())
    for line in lines:
        console.print(line)
    (out / "report.txt").write_text("\n".join(lines) + "\n")
    (out / "report.json").write_text(json.dumps(lines, indent=1))


if __name__ == "__main__":
    sys.exit(guarded(main))
