"""Held-out evaluation: accuracy and mean loss on the test split.

With `collective=True` every worker scores its own part of the test split and the counts are
summed with one all-reduce, so an evaluation costs each worker 1/N of the work.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ringps.data import Split
from ringps.data.loader import test_batches


class EvalResult(NamedTuple):
    accuracy: float
    loss: float
    samples: int


@torch.no_grad()
def evaluate(
    model: nn.Module,
    split: Split,
    stats: tuple[float, float],
    device: torch.device,
    part: int = 0,
    parts: int = 1,
    group: Optional[dist.ProcessGroup] = None,
    batch_size: int = 256,
) -> EvalResult:
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # correct, samples, loss sum
    for b in test_batches(split, batch_size, stats, part, parts):
        logits = model(b.inputs.to(device))
        y = b.targets.to(device)
        totals[0] += (logits.argmax(1) == y).sum().item()
        totals[1] += len(y)
        totals[2] += F.cross_entropy(logits, y, reduction="sum").item()
    if parts > 1:
        dist.all_reduce(totals, group=group)
    model.train(was_training)
    n = max(totals[1].item(), 1.0)
    return EvalResult(totals[0].item() / n, totals[2].item() / n, int(totals[1].item()))
