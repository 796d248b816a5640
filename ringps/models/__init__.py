"""Models by name: `build_model("facenet", in_shape=(1, 112, 92), num_classes=40)`.

facenet: conv stack then large fully connected layers (>= 90% of parameters in FC, most compute
in conv), the shape the layer-aware strategy is about. resnet-small: a small residual network
(GroupNorm, so no buffers to synchronise). mlp: two hidden layers.
"""

from __future__ import annotations

import torch.nn as nn

from ringps.registry import Registry

MODELS: Registry = Registry("model")


def build_model(name: str, in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    return MODELS.build(name, in_shape, num_classes)


from ringps.models import facenet, mlp, resnet  # noqa: E402,F401  (registration)
