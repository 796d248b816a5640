"""Per-layer profile, the transmission plan, and the wait-free launch order (docs/DESIGN.md)."""
