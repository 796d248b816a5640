"""Models: shapes on every dataset's input, and facenet's FC-heavy parameter split."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from ringps.models import MODELS, build_model


@pytest.mark.parametrize("name", MODELS.names())
@pytest.mark.parametrize("shape, classes", [((1, 112, 92), 40), ((1, 28, 28), 10), ((3, 32, 32), 7)])
def test_forward_shapes(name, shape, classes):
    m = build_model(name, shape, classes)
    out = m(torch.randn(2, *shape))
    assert out.shape == (2, classes)
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_facenet_keeps_most_parameters_in_fc_and_has_no_buffers():
    m = build_model("facenet", (1, 112, 92), 40)
    total = sum(p.numel() for p in m.parameters())
    fc = sum(p.numel() for mod in m.modules() if isinstance(mod, nn.Linear) for p in mod.parameters())
    assert fc / total >= 0.9 and total > 10_000_000
    assert list(m.buffers()) == []
