"""mlp: flatten, two hidden layers with ReLU, a linear classifier."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ringps.models import MODELS


@MODELS.register("mlp")
class MLP(nn.Module):
    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, hidden: int = 512):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(math.prod(in_shape), hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden // 2), nn.ReLU(inplace=True),
            nn.Linear(hidden // 2, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
