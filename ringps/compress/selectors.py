"""Selectors: which k entries of a flat accumulated gradient to send.

- `topk`: exact `torch.topk(|acc|, k)` (about 200 ms for 1e7 floats on this CPU).
- `threshold`: DGC's sampled threshold. Estimate the k-th largest magnitude from a strided random
  sample, keep everything above it, and fix the count: trim with an exact top-k of the (small)
  survivor set when too many pass, fall back to exact top-k when too few do (~50 ms for 1e7).
- `randomk`: k positions from a generator seeded identically on every rank, so every rank picks
  the same positions (a shared index set for free).
- `auto`: `threshold` for large tensors, `topk` for small ones.

Indices come back sorted ascending: scatter-adds into a dense buffer then touch memory in order,
which is what makes the sparse bookkeeping cheap.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ringps.compress import SELECTORS

SAMPLE_FRACTION = 0.01
MIN_SAMPLE = 2048
AUTO_THRESHOLD_NUMEL = 1 << 20  # below this, exact top-k is as fast


class Selection(NamedTuple):
    indices: torch.Tensor  # (k,) int64, sorted ascending
    values: torch.Tensor  # (k,) same dtype as the input


class Selector:
    shared_indices = False  # True: every rank selects the same positions

    def select(self, acc: torch.Tensor, k: int, step: int = 0, key: int = 0) -> Selection:
        raise NotImplementedError


def _take(acc: torch.Tensor, idx: torch.Tensor) -> Selection:
    idx, _ = torch.sort(idx)
    return Selection(idx, acc[idx])


@SELECTORS.register("topk")
class TopK(Selector):
    def select(self, acc: torch.Tensor, k: int, step: int = 0, key: int = 0) -> Selection:
        n = acc.numel()
        k = max(0, min(k, n))
        if k == n:
            return Selection(torch.arange(n, device=acc.device), acc.clone())
        if k == 0:
            return Selection(torch.empty(0, dtype=torch.long, device=acc.device), acc.new_empty(0))
        return _take(acc, torch.topk(acc.abs(), k, sorted=False).indices)


@SELECTORS.register("threshold")
class SampledThreshold(Selector):
    """DGC (Lin et al. 2018) threshold estimation with a bounded count."""

    def __init__(self, low: float = 0.8, high: float = 1.25, seed: int = 0):
        self.low, self.high = low, high
        self.gen = torch.Generator().manual_seed(seed)
        self.fallbacks = 0  # how often the estimate was too far off
        self._scratch: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # numel -> (|acc|, mask)

    def _buffers(self, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reused per size: fresh 40 MB buffers each step cost more in page faults than the math."""
        n = acc.numel()
        if n not in self._scratch or self._scratch[n][0].dtype != acc.dtype or self._scratch[n][0].device != acc.device:
            self._scratch[n] = (torch.empty_like(acc), torch.empty(n, dtype=torch.bool, device=acc.device))
        return self._scratch[n]

    def select(self, acc: torch.Tensor, k: int, step: int = 0, key: int = 0) -> Selection:
        n = acc.numel()
        if k <= 0 or k >= n or n < 4 * MIN_SAMPLE:
            return TopK().select(acc, k)
        mag, mask = self._buffers(acc)
        torch.abs(acc, out=mag)
        stride = max(1, n // max(MIN_SAMPLE, int(n * SAMPLE_FRACTION)))
        start = int(torch.randint(0, stride, (1,), generator=self.gen, device="cpu"))
        sample = mag[start::stride]
        ks = max(1, round(k * sample.numel() / n))
        threshold = torch.topk(sample, ks, sorted=False).values.min()
        idx = torch.nonzero(torch.ge(mag, threshold, out=mask), as_tuple=True)[0]  # sorted already
        count = idx.numel()
        if count > self.high * k:
            keep = torch.topk(mag[idx], k, sorted=False).indices
            return _take(acc, idx[keep])
        if count < self.low * k:
            self.fallbacks += 1
            return TopK().select(acc, k)
        return Selection(idx, acc[idx])


@SELECTORS.register("randomk")
class RandomK(Selector):
    shared_indices = True

    def __init__(self, seed: int = 0):
        self.seed = seed

    def select(self, acc: torch.Tensor, k: int, step: int = 0, key: int = 0) -> Selection:
        n = acc.numel()
        k = max(0, min(k, n))
        # drawn on the CPU whatever the gradients' device: the same positions on every rank and
        # device (a CUDA generator draws another sequence)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 7_919 + key)  # same on every rank
        if k > n // 4:
            idx = torch.randperm(n, generator=g, device="cpu")[:k]
        else:
            idx = torch.unique(torch.randint(0, n, (k,), generator=g, device="cpu"))  # a few repeats fall away
        return _take(acc, idx.to(acc.device))


@SELECTORS.register("auto")
class Auto(Selector):
    def __init__(self, seed: int = 0):
        self.topk, self.threshold = TopK(), SampledThreshold(seed=seed)

    def select(self, acc: torch.Tensor, k: int, step: int = 0, key: int = 0) -> Selection:
        s = self.threshold if acc.numel() >= AUTO_THRESHOLD_NUMEL else self.topk
        return s.select(acc, k, step, key)
