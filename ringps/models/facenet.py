"""facenet: three conv blocks (most of the compute) then three FC layers (most of the parameters).

On orl-faces (1x112x92) it has 10.6M parameters, 99.5% of them in fc1 (9856 x 1024).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ringps.models import MODELS


@MODELS.register("facenet")
class FaceNet(nn.Module):
    def __init__(self, in_shape: tuple[int, int, int], num_classes: int, width: int = 32, hidden: int = 1024):
        super().__init__()
        c, h, w = in_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, width, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 2 * width, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        )
        flat = 2 * width * (h // 8) * (w // 8)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, hidden), nn.ReLU(inplace=True), nn.Dropout(0.3),
            nn.Linear(hidden, hidden // 2), nn.ReLU(inplace=True),
            nn.Linear(hidden // 2, num_classes),
        )
        # He initialisation: PyTorch's default leaves this unnormalised ReLU stack on a plateau
        # for the first ~8 epochs of orl-faces
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
