"""Per-worker batches: a disjoint, complete shard of every epoch, normalised and augmented.

Every worker draws the same permutation for an epoch (a generator seeded by seed and epoch) and
takes every N-th index from its own offset, so the shards of one epoch are disjoint and together
cover the whole training split. Each shard is cut into the same number of batches on every
worker (`steps_per_epoch`), which synchronous strategies need; batch sizes differ by at most one.
"""

from __future__ import annotations

import math
from typing import Iterator, NamedTuple

import torch
import torch.nn.functional as F

from ringps.data import Split
from ringps.errors import DataError


class Batch(NamedTuple):
    inputs: torch.Tensor  # (b, C, H, W) float32, normalised
    targets: torch.Tensor  # (b,) int64
    indices: torch.Tensor  # (b,) positions in the split (for tests and debugging)


def shard_indices(n: int, worker: int, workers: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)[worker::workers]


def normaliser(images: torch.Tensor) -> tuple[float, float]:
    x = images.float() / 255
    return x.mean().item(), max(x.std().item(), 1e-3)


def steps_per_epoch(n: int, workers: int, batch_size: int) -> int:
    """Batches per worker per epoch; the smallest shard decides, so no batch is ever empty."""
    return max(1, min(math.ceil(n / (workers * batch_size)), n // workers))


class ShardedLoader:
    """Iterate `for batch in loader.epoch(e)`; `len(loader)` is steps per epoch on every worker."""

    def __init__(
        self,
        split: Split,
        worker: int,
        workers: int,
        batch_size: int,
        seed: int,
        augment: bool = False,
        stats: tuple[float, float] | None = None,
    ):
        n = len(split.labels)
        if n < workers:
            raise DataError(f"the training split has {n} samples, fewer than --workers {workers}")
        self.split, self.worker, self.workers = split, worker, workers
        self.batch_size, self.seed, self.augment = batch_size, seed, augment
        self.mean, self.std = stats or normaliser(split.images)
        self.steps_per_epoch = steps_per_epoch(n, workers, batch_size)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def epoch(self, epoch: int) -> Iterator[Batch]:
        idx = shard_indices(len(self.split.labels), self.worker, self.workers, self.seed, epoch)
        g = torch.Generator().manual_seed(self.seed * 7919 + epoch * 31 + self.worker)
        for part in torch.tensor_split(idx, self.steps_per_epoch):
            yield self.make_batch(part, g if self.augment else None)

    def make_batch(self, idx: torch.Tensor, g: torch.Generator | None = None) -> Batch:
        x = self.split.images[idx].float().div_(255)
        if g is not None:
            x = augment(x, g)
        x = x.sub_(self.mean).div_(self.std)
        return Batch(x, self.split.labels[idx], idx)


def augment(x: torch.Tensor, g: torch.Generator, shift: int = 4) -> torch.Tensor:
    """Light augmentation: random shifts of up to `shift` pixels and horizontal flips."""
    b, _, h, w = x.shape
    padded = F.pad(x, (shift, shift, shift, shift), mode="replicate")
    dy = torch.randint(0, 2 * shift + 1, (b,), generator=g).tolist()
    dx = torch.randint(0, 2 * shift + 1, (b,), generator=g).tolist()
    out = torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(b)])
    flip = torch.rand(b, generator=g) < 0.5
    out[flip] = out[flip].flip(-1)
    return out


def test_batches(split: Split, batch_size: int, stats: tuple[float, float], part: int = 0, parts: int = 1):
    """The held-out split, optionally cut into `parts` disjoint pieces (one per worker)."""
    idx = torch.arange(len(split.labels))[part::parts]
    mean, std = stats
    for chunk in torch.split(idx, batch_size):
        x = split.images[chunk].float().div_(255).sub_(mean).div_(std)
        yield Batch(x, split.labels[chunk], chunk)
