"""Benchmark: what glibc's allocator costs a step, with DDP's fp16 hook and with ring-topk's hook.

Four gloo ranks on loopback train facenet (ORL's image shape, batch 16, random pixels: the step's
cost does not depend on them) with DDP's `fp16_compress_hook` and with ring-topk's hook sending
the same bytes (`exchange="dense-fp16"`), each with glibc's default allocator settings and with
freed memory kept (`ringps.malloc.keep_freed_memory`, what every ringps worker does). Repeats are
interleaved; medians [min..max] over repeats of each rank-median, ratios to fp16 with the defaults.
Page faults and system time come from getrusage, per step.

    .venv/bin/python benchmarks/malloc.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

from common import add_out_arg, console, guarded, write_report
from rich.markup import escape
from rich.table import Table

CONTENDERS = {"fp16 default": ("fp16", 0), "fp16 kept": ("fp16", 256),
              "ring-topk default": ("ring-topk", 0), "ring-topk kept": ("ring-topk", 256)}
PHASES = ("step", "forward", "backward", "optimizer", "evaluation", "faults", "system ms")


def rank_main(rank: int, world: int, hook: str, keep_mb: int, port: int, steps: int, queue) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ringps.hooks import RingTopkState, ring_topk_hook
    from ringps.malloc import keep_freed_memory
    from ringps.models import build_model

    torch.set_num_threads(1)
    keep_freed_memory(keep_mb)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = build_model("facenet", (1, 112, 92), 40)
    ddp = DDP(model, gradient_as_bucket_view=True)
    state = None
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        state = RingTopkState(exchange="dense-fp16").bind(model)
        ddp.register_comm_hook(state, ring_topk_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x, y, held_out = torch.randn(16, 1, 112, 92), torch.randint(0, 40, (16,)), torch.randn(40, 1, 112, 92)
    times: dict[str, list[float]] = {p: [] for p in PHASES[:5]}
    warm = 5  # DDP rebuilds its buckets after the first step; allocator caches fill over a few more
    for i in range(steps + warm):
        if i == warm:
            before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        loss = F.cross_entropy(ddp(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i % 5 == 4:  # an evaluation every 5 steps, as the training benchmarks do
            with torch.no_grad():
                model.eval()
                model(held_out)
                model.train()
        t4 = time.perf_counter()
        if i >= warm:
            for p, s in zip(PHASES[:4], (t3 - t0, t1 - t0, t2 - t1, t3 - t2)):
                times[p].append(s)
            if i % 5 == 4:
                times["evaluation"].append(t4 - t3)
    after = resource.getrusage(resource.RUSAGE_SELF)
    out = {p: statistics.median(v) * 1e3 for p, v in times.items()}
    out["faults"] = (after.ru_minflt - before.ru_minflt) / steps
    out["system ms"] = (after.ru_stime - before.ru_stime) * 1e3 / steps
    queue.put(out)
    dist.barrier()
    dist.destroy_process_group()
    if state is not None:
        state.close()


def one_run(hook: str, keep_mb: int, port: int, steps: int, workers: int) -> dict[str, float]:
    """Every rank's figures, their median per phase."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, workers, hook, keep_mb, port, steps, queue)) for r in range(workers)]
    for p in procs:
        p.start()
    try:
        outs = [queue.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return {k: statistics.median(o[k] for o in outs) for k in PHASES}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--workers", type=int, default=4)
    add_out_arg(p)
    args = p.parse_args()
    out = args.out or Path("runs") / f"bench-malloc-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    port = 29700 + os.getpid() % 1000
    for r in range(args.repeats):
        for label, (hook, keep) in CONTENDERS.items():
            port += 1
            results[label].append(one_run(hook, keep, port, args.steps, args.workers))
            console.print(f"[{r + 1}/{args.repeats}] {label}: step {results[label][-1]['step']:.0f} ms, "
                          f"{results[label][-1]['faults']:.0f} faults/step")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    ref = "fp16 default"
    t = Table(title=escape(f"facenet, {args.workers} gloo ranks on loopback, {args.steps} steps, {args.repeats} repeats: "
              f"medians per step [min..max], ratio to {ref}"), title_justify="left")
    t.add_column("contender", style="bold")
    for ph in PHASES:
        t.add_column(ph + (" ms" if ph not in ("faults", "system ms") else ""), justify="right")
    lines = [f"facenet, {args.workers} gloo ranks on loopback, {args.steps} steps, {args.repeats} repeats: medians "
             f"per step [min..max], ratio to {ref}"]
    for label, runs in results.items():
        cells = []
        for ph in PHASES:
            vals = [x[ph] for x in runs]
            m, m0 = statistics.median(vals), statistics.median(x[ph] for x in results[ref])
            cells.append(f"{m:.0f} [{min(vals):.0f}..{max(vals):.0f}]" + (f" ({m / m0:.2f}x)" if label != ref and m0 else ""))
        t.add_row(label, *cells)
        lines.append(f"{label}: " + ", ".join(f"{ph} {c}" for ph, c in zip(PHASES, cells)))
    console.print(t)
    write_report(out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    guarded(main)
