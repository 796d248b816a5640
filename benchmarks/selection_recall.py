"""Benchmark: how much of the gradient each way of choosing k common positions carries, on real
gradients (facenet on ORL, the ring-topk benchmark's task), against each rank's own top k.

One process plays N ranks: every step each rank computes its gradient on its own shard's batch,
the model steps on their dense average (SGD, momentum 0.9), and every selection rule keeps its own
error-feedback memory per rank along that same trajectory. Per large tensor and step it reports
  - rank recall: the share of the mass (sum of |acc|) of each rank's exact top k of its own
    accumulation that the sent positions cover (allgather: 1 by definition);
  - sum energy: the squared norm of the summed update the rule sends, over that of the ideal k-sparse
    update of the summed accumulations (its exact top k).
Rules: shared-index as shipped (blocks of 256, the next pick predicted from ||residual||^2 +
||gradient||^2), with the prediction ||residual + gradient||^2, with this step's true block scores
(an oracle no exchange has), blocks of 16 (oracle), rows x columns of the weight matrix (oracle),
the exact common top k of sum_r |acc_r| (an ideal that would need a dense message), and allgather.

    .venv/bin/python benchmarks/selection_recall.py --steps 20
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from common import console, guarded
from rich.table import Table

from ringps.comm.exchanges import Segment, SharedIndex
from ringps.data import Split
from ringps.data.loader import ShardedLoader
from ringps.data.orl import PEOPLE, PER_PERSON, load_orl
from ringps.models import build_model

RULES = ("shared-index", "shared-index, summed predictor", "blocks of 256, oracle", "blocks of 16, oracle",
         "rows x columns, oracle", "exact common top k", "allgather (each rank's own top k)")


def blocks(si: SharedIndex, scores: torch.Tensor, n: int, k: int) -> torch.Tensor:
    return si.pick([Segment(0, n, k, 0)], scores)[0]


def select(rule: str, accs, grads, state: dict, name: str, shape: tuple[int, int], k: int):
    """The positions each rank sends (a list, one per rank) and, for the predicting rules, what
    they keep for the next step's pick."""
    n = accs[0].numel()
    if rule.startswith("allgather"):
        return [torch.topk(a.abs(), k).indices for a in accs]
    if rule == "exact common top k":
        return [torch.topk(sum(a.abs() for a in accs), k).indices] * len(accs)
    if rule == "rows x columns, oracle":
        R, C = shape
        nr = max(1, min(R, round(R * (k / n) ** 0.5)))
        rows = sum(a.view(R, C).square().sum(1) for a in accs)
        cols = sum(a.view(R, C).square().sum(0) for a in accs)
        ri, ci = torch.topk(rows, nr).indices, torch.topk(cols, max(1, min(C, k // nr))).indices
        return [(ri.unsqueeze(1) * C + ci.unsqueeze(0)).flatten()] * len(accs)
    si = SharedIndex(16 if "16" in rule else 256)
    now = sum(si.block_scores([a]) for a in accs)
    scores = now if "oracle" in rule else state.get(name, now)  # the first step: agree on this step's
    sent = blocks(si, scores, n, k)
    if "oracle" not in rule:  # the next pick, predicted from what stays and this step's gradient
        after = [a.clone().index_fill_(0, sent, 0) for a in accs]
        if "summed" in rule:
            state[name] = sum(si.block_scores([r + g]) for r, g in zip(after, grads))
        else:
            state[name] = sum(si.block_scores([r]) + si.block_scores([g]) for r, g in zip(after, grads))
    return [sent] * len(accs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--min-numel", type=int, default=1 << 17, help="tensors this large are selected (the hook's dense_below)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    x, y = load_orl()
    train = (torch.arange(len(y)) % PER_PERSON) < 7
    split, N = Split(x[train], y[train]), args.workers
    loaders = [ShardedLoader(split, r, N, args.batch_size, args.seed, augment=True) for r in range(N)]
    model = build_model("facenet", tuple(x.shape[1:]), PEOPLE)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    large = [(n, q) for n, q in model.named_parameters() if q.numel() >= args.min_numel]
    mems = {r: {n: [torch.zeros(q.numel()) for _ in range(N)] for n, q in large} for r in RULES}
    states: dict[str, dict] = {r: {} for r in RULES}
    recall: dict[str, list[float]] = {r: [] for r in RULES}
    energy: dict[str, list[float]] = {r: [] for r in RULES}
    epoch, batches = 0, iter(())
    for step in range(args.steps):
        try:
            shard = next(batches)
        except StopIteration:
            batches = zip(*[ld.epoch(epoch) for ld in loaders])
            epoch, shard = epoch + 1, next(batches)
        grads, dense = [], None
        for b in shard:
            model.zero_grad()
            F.cross_entropy(model(b.inputs), b.targets).backward()
            grads.append({n: q.grad.detach().flatten().clone() for n, q in large})
            mine = [q.grad.detach().clone() for q in model.parameters()]
            dense = mine if dense is None else [a + c for a, c in zip(dense, mine)]
        for name, q in large:
            n = q.numel()
            k = max(1, int(args.density * n))
            for rule in RULES:
                mem = mems[rule][name]
                accs = [mem[r] + grads[r][name] for r in range(N)]
                g = [grads[r][name] for r in range(N)]
                sent = select(rule, accs, g, states[rule], name, (q.shape[0], n // q.shape[0]), k)
                update = torch.zeros(n)
                for r in range(N):
                    mag = accs[r].abs()
                    top = torch.topk(mag, k).indices
                    hit = torch.zeros(n, dtype=torch.bool).index_fill_(0, sent[r], True)[top]
                    if step > 0:  # the first step agrees on scores
                        recall[rule].append(float(mag[top][hit].sum() / mag[top].sum()))
                    update[sent[r]] += accs[r][sent[r]]
                    mem[r].copy_(accs[r].index_fill_(0, sent[r], 0))
                total = sum(mem) + update  # the summed accumulation (what stays + what was sent)
                if step > 0:
                    ideal = torch.topk(total.abs(), k).values.square().sum()
                    energy[rule].append(float(update.square().sum() / ideal))
        for q, g in zip(model.parameters(), dense):
            q.grad = g / N
        opt.step()
        console.print(f"step {step + 1}/{args.steps}", end="\r")
    t = Table(title=f"selection on facenet/ORL gradients: {N} ranks, density {args.density}, {args.steps} steps, "
              f"tensors >= {args.min_numel:,} entries (means over ranks, tensors and steps 2..)")
    for c in ("rule", "rank recall", "sum energy"):
        t.add_column(c, justify="left" if c == "rule" else "right")
    for rule in RULES:
        t.add_row(rule, f"{statistics.mean(recall[rule]):.3f}", f"{statistics.mean(energy[rule]):.3f}")
    console.print(t)


if __name__ == "__main__":
    guarded(main)
