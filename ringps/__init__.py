"""ringps: data-parallel PyTorch training that stays fast on slow networks and stable on unequal
workers. Layers, from the top: cli, integrations -> launch -> train -> strategies -> hooks, ps,
sim -> comm, schedule -> compress, data, models -> config, cost -> errors, record, registry,
trace (docs/DESIGN.md; tests/test_architecture.py keeps imports pointing down)."""

__version__ = "0.1.0"
