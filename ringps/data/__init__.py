"""Datasets by name, each returned as uint8 image tensors plus labels (see `Dataset`).

`load_dataset(cfg.data)` gives the train and the held-out test split; `ShardedLoader` gives each
worker its own disjoint part of every epoch. Images stay uint8 in memory (Fashion-MNIST is 55 MB
that way) and become normalised floats one batch at a time.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from ringps.registry import Registry


class Split(NamedTuple):
    images: torch.Tensor  # (n, C, H, W) uint8
    labels: torch.Tensor  # (n,) int64


class Dataset(NamedTuple):
    name: str
    train: Split
    test: Split
    num_classes: int
    augment: bool  # whether light augmentation suits this data

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.train.images.shape[1:])  # type: ignore[return-value]


DATASETS: Registry[Callable[..., Dataset]] = Registry("dataset")


def load_dataset(cfg) -> Dataset:
    """cfg: DataConfig. `folder:PATH` is the one name with an argument."""
    name = cfg.dataset
    if name.startswith("folder:"):
        return DATASETS.get("folder")(cfg, name.split(":", 1)[1])
    return DATASETS.get(name)(cfg)


from ringps.data import fashion, folder, orl, synthetic  # noqa: E402,F401  (registration)
from ringps.data.loader import ShardedLoader, shard_indices  # noqa: E402,F401
