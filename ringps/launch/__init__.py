"""Launching: the local process launcher, the per-process entry (also torchrun's), the emulated
cluster (network namespaces + tc)."""
