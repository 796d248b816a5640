"""synthetic: any number and size of images, for throughput runs.

Each class has a fixed random prototype; a sample is its prototype plus noise, so the task is
learnable and accuracy means something. Deterministic in the seed.
"""

from __future__ import annotations

import torch

from ringps.data import DATASETS, Dataset, Split


@DATASETS.register("synthetic")
def synthetic(cfg, seed: int = 1234) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    shape, classes = tuple(cfg.synthetic_shape), cfg.synthetic_classes
    protos = torch.rand((classes, *shape), generator=g) * 255

    def make(n: int) -> Split:
        y = torch.randint(0, classes, (n,), generator=g)
        x = protos[y] + torch.randn((n, *shape), generator=g) * 60
        return Split(x.clamp(0, 255).to(torch.uint8), y)

    n = cfg.synthetic_samples
    return Dataset("synthetic", make(n), make(max(n // 5, classes)), classes, augment=False)
