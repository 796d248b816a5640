"""Communication: byte meters, the dense ring, the sparse exchanges (DESIGN.md)."""
