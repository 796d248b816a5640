"""resnet-small: a stem, three residual stages (16/32/64 channels), global pooling, one FC layer.

GroupNorm instead of BatchNorm keeps the model free of buffers, so every strategy (DDP, ring,
parameter server) synchronises exactly the parameters and nothing else.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ringps.models import MODELS


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(8, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(8, cout)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.GroupNorm(8, cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(y)) + self.skip(x))


@MODELS.register("resnet-small")
class ResNetSmall(nn.Module):
    def __init__(self, in_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        c = in_shape[0]
        self.stem = nn.Sequential(nn.Conv2d(c, 16, 3, padding=1, bias=False), nn.GroupNorm(8, 16), nn.ReLU())
        self.stages = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))
