"""The training loop, evaluation, metrics, checkpoints and run summaries."""
