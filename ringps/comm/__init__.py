"""Communication: byte meters, the dense ring, the sparse exchanges (docs/DESIGN.md)."""
